/* SPDX-License-Identifier: Apache-2.0 */
/* The [cluster] keys: peers, export rules, the shared key, the pull
 * group, this node's name and address; and how a peer is named in the
 * errors local clients get. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"
#include "log.h"
#include "util.h"

/* "HOST:PORT" or "[V6]:PORT" to a socket address. */
int gshmd__cluster_parse_address(const char *s, struct sockaddr_storage *sa, socklen_t *len,
                                 const char **why_out) {
  char host[128], port[16];
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *res = NULL;
  const char *colon;
  size_t hl;

  *why_out = "no ':PORT' (want ADDRESS:PORT, such as 10.0.0.5:7470, or [V6]:PORT)";
  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':')
      return -EINVAL;
    hl = (size_t)(end - s - 1);
    s++;
    colon = end + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return -EINVAL;
    hl = (size_t)(colon - s);
  }
  *why_out = hl ? "an address of 127 bytes at most" : "no ADDRESS before ':PORT' (0.0.0.0:PORT "
                                                      "is every IPv4 interface)";
  if (hl == 0 || hl >= sizeof(host))
    return -EINVAL;
  memcpy(host, s, hl);
  host[hl] = '\0';
  *why_out = "PORT is not a number 1..65535";
  if (!colon[1] || strlen(colon + 1) >= sizeof(port))
    return -EINVAL;
  strcpy(port, colon + 1);
  if (strspn(port, "0123456789") != strlen(port) || atoi(port) <= 0 || atoi(port) > 65535)
    return -EINVAL;
  *why_out = "this host cannot resolve its ADDRESS";
  if (getaddrinfo(host, port, &hints, &res) || !res)
    return -EINVAL;
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

static int parse_peers(struct links *ll, const char *spec) {
  char *copy = strdup(spec ? spec : ""), *save = NULL, *tok;
  const char *why;
  unsigned cap = 0;

  if (!copy)
    return -ENOMEM;
  for (tok = strtok_r(copy, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
    char *eq = strchr(tok, '=');
    struct peer *p;
    if (!eq || eq == tok || (size_t)(eq - tok) >= sizeof(p->name) ||
        strlen(eq + 1) >= sizeof(p->address)) {
      gshm_log_err("cluster.peers: '%s' is not NAME=ADDRESS:PORT", tok);
      free(copy);
      return -EINVAL;
    }
    if (ll->npeers == cap) {
      struct peer *n = realloc(ll->peers, sizeof(*n) * (cap = cap ? 2 * cap : 8));
      if (!n) {
        free(copy);
        return -ENOMEM;
      }
      ll->peers = n;
    }
    p = &ll->peers[ll->npeers];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%.*s", (int)(eq - tok), tok);
    snprintf(p->address, sizeof(p->address), "%s", eq + 1);
    if (!gshmd__cluster_name_ok(p->name)) {
      gshm_log_err("cluster.peers: peer name '%s': " GSHMD_CLUSTER_NAME_RULE, p->name);
      free(copy);
      return -EINVAL;
    }
    if (gshmd__cluster_parse_address(p->address, &p->sa, &p->salen, &why)) {
      gshm_log_err("cluster.peers: peer '%s': address '%s': %s", p->name, p->address, why);
      free(copy);
      return -EINVAL;
    }
    for (unsigned i = 0; i < ll->npeers; i++)
      if (!strcmp(ll->peers[i].name, p->name)) {
        gshm_log_err("cluster.peers: peer '%s' named twice", p->name);
        free(copy);
        return -EINVAL;
      }
    /* one peers list for every node of a fleet names this one too: not a
     * peer of itself (it linked to itself and showed as "up") */
    if (!strcmp(p->name, ll->node_name)) {
      gshm_log_notice("cluster.peers: '%s' is this node (cluster.node_name): not a peer of "
                      "itself",
                      p->name);
      continue;
    }
    ll->npeers++;
  }
  free(copy);
  for (unsigned i = 0; i < ll->npeers; i++)
    gshm_list_init(&ll->peers[i].waiting); /* after the last realloc */
  return 0;
}

/* OWNER of an export rule: a user (name or uid), or "@" and a group
 * (name or gid). */
static int parse_owner(const char *who, struct export_rule *rule) {
  bool group = who[0] == '@';
  const char *name = who + group;
  char *end;
  unsigned long id;

  if (!*name)
    return -EINVAL;
  errno = 0;
  id = strtoul(name, &end, 10);
  if (name[0] >= '0' && name[0] <= '9' && !*end && !errno && id < UINT32_MAX) {
    rule->id = (uint32_t)id;
  } else if (group) {
    struct group *g = getgrnam(name);
    if (!g)
      return -ENOENT;
    rule->id = g->gr_gid;
  } else {
    struct passwd *pw = getpwnam(name);
    if (!pw)
      return -ENOENT;
    rule->id = pw->pw_uid;
  }
  rule->owner = group ? EXPORT_GROUP : EXPORT_USER;
  return 0;
}

/* cluster.export: PATTERN or PATTERN:OWNER rules (docs/CLUSTER.md,
 * "What peers may read"). */
static int parse_exports(struct gshmd_cluster *cl, const char *spec) {
  char *copy = strdup(spec ? spec : ""), *save = NULL, *tok;
  int e = 0;

  if (!copy)
    return -ENOMEM;
  for (tok = strtok_r(copy, " \t,", &save); tok && !e; tok = strtok_r(NULL, " \t,", &save)) {
    struct export_rule *n, rule = {.owner = EXPORT_ADMINS};
    char *colon = strchr(tok, ':');

    if (colon) {
      *colon = '\0';
      if (!*tok || (e = parse_owner(colon + 1, &rule))) {
        const char *who = colon + 1;
        if (*tok && e == -ENOENT && who[0] == '@')
          gshm_log_err("cluster.export '%s:%s': no such group '%s'", tok, who, who + 1);
        else if (*tok && e == -ENOENT)
          gshm_log_err("cluster.export '%s:%s': no such user '%s' (a group is @GROUP)", tok, who,
                       who);
        else
          gshm_log_err("cluster.export '%s:%s': %s", tok, who,
                       !*tok ? "want PATTERN or PATTERN:OWNER"
                             : "want PATTERN:USER or PATTERN:@GROUP");
        e = -EINVAL;
        break;
      }
    }
    if (!(n = realloc(cl->exports, sizeof(*n) * (cl->nexport + 1))) ||
        !(rule.pattern = strdup(tok))) {
      if (n)
        cl->exports = n;
      e = -ENOMEM;
      break;
    }
    cl->exports = n;
    cl->exports[cl->nexport++] = rule;
  }
  free(copy);
  return e;
}

/* Says why the key file at path did not open (errno) and what to do: the
 * errno alone ("Permission denied", "Too many levels of symbolic links")
 * left the admin to find whose the file is, or that it is a link. */
static void secret_open_failed(const char *path) {
  int err = errno;
  struct stat st;

  if (err == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
    gshm_log_err("cluster.secret_file %s: a symbolic link, which gshmd does not follow; name "
                 "the file itself", path);
  else if (err == EACCES && stat(path, &st) == 0)
    gshm_log_err("cluster.secret_file %s: gshmd (uid %u) may not read it: mode %04o owned by "
                 "uid %u; it must be owned by uid %u with no group or other permissions "
                 "(chown, then chmod 0600)",
                 path, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777),
                 (unsigned)st.st_uid, (unsigned)geteuid());
  else if (err == ENOENT)
    gshm_log_err("cluster.secret_file %s: no such file; make the key once, readable by gshmd's "
                 "user alone: (umask 077; head -c 32 /dev/urandom | base64 > %s); then copy "
                 "it to every node with its mode (scp -p; docs/CLUSTER.md, Setup)", path, path);
  else {
    errno = err;
    gshm_log_err("cluster.secret_file %s: %m", path);
  }
}

/* The most bytes of a key file: past them the rest went unread, and two
 * files that differ only there made the same key; such a file is
 * refused (docs/CLUSTER.md). */
#define SECRET_FILE_MAX 4096

/* The shared key: a file only gshmd's user may read, of at most
 * SECRET_FILE_MAX bytes; its bytes (blanks around them dropped) hashed
 * to crypto_auth's key size, and the subkeys made from that at once
 * (subkeys.h). */
static int read_secret(struct gshmd_cluster *cl, const char *path) {
  uint8_t buf[SECRET_FILE_MAX + 1]; /* (one more: a longer file is seen) */
  struct stat st;
  ssize_t n;
  size_t b = 0, e;
  int fd;

  if (!path || !*path) {
    gshm_log_err("cluster.secret_file is required when the cluster is on (cluster.listen or "
                 "cluster.peers set): name a file of the key every node shares, made once with "
                 "(umask 077; head -c 32 /dev/urandom | base64 > FILE) (docs/CLUSTER.md, Setup)");
    return -EINVAL;
  }
  /* (O_NONBLOCK: a FIFO named there hung the start in open; refused below) */
  if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0) {
    secret_open_failed(path);
    return -EINVAL;
  }
  if (fstat(fd, &st) < 0) {
    gshm_log_err("cluster.secret_file %s: %m", path);
    close(fd);
    return -EINVAL;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    /* what it found first: the rule alone left the user to find it */
    gshm_log_err("cluster.secret_file %s: %s %04o owned by uid %u; it must be a regular file "
                 "owned by uid %u (gshmd's user) with no group or other permissions "
                 "(chmod 0600)",
                 path, !S_ISREG(st.st_mode) ? "not a regular file: mode" : "is mode",
                 (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)geteuid());
    close(fd);
    return -EINVAL;
  }
  n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n < 0) {
    gshm_log_err("cluster.secret_file %s: %m", path);
    return -EINVAL;
  }
  if (n > SECRET_FILE_MAX) {
    gshm_log_err("cluster.secret_file %s: more than %u bytes; a key file holds one key "
                 "(32 random bytes, base64: docs/CLUSTER.md)",
                 path, SECRET_FILE_MAX);
    sodium_memzero(buf, sizeof(buf));
    return -EINVAL;
  }
  e = (size_t)n;
  while (b < e && (buf[b] == ' ' || buf[b] == '\n' || buf[b] == '\t' || buf[b] == '\r'))
    b++;
  while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\n' || buf[e - 1] == '\t' ||
                   buf[e - 1] == '\r'))
    e--;
  if (e - b < 16) {
    gshm_log_err("cluster.secret_file %s: the key must be at least 16 bytes, it has %zu; "
                 "make a random one: (umask 077; head -c 32 /dev/urandom | base64 > %s), the "
                 "same on every node", path, e - b, path);
    sodium_memzero(buf, sizeof(buf));
    return -EINVAL;
  }
  crypto_generichash(cl->keys.raw, sizeof(cl->keys.raw), buf + b, e - b, NULL, 0);
  sodium_memzero(buf, sizeof(buf));
  gshmd__subkeys_derive(&cl->keys);
  return 0;
}

bool gshmd__cluster_name_ok(const char *s) {
  size_t n = strlen(s);
  /* (a comma separates names in lists of sources and in the path of
   * relayed bytes, where a lone "?" stands for the unknown rest:
   * relay_path.h; a colon a peer from a segment's name, in gshmctl pull
   * PEER:NAME and a source PEER:NAME#ID.GEN; a quote or a backslash
   * broke the metrics' label values, peer="...", and with them every
   * scrape of the node, as does a byte of no valid UTF-8; a C1 control
   * or a bidi override is no name's: gshm__text_clean changes neither) */
  char clean[64];

  if (n == 0 || n > 63 || !strcmp(s, "?"))
    return false;
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f || strchr(",:\"\\", *p))
      return false;
  memcpy(clean, s, n + 1);
  gshm__text_clean(clean);
  return !strcmp(clean, s);
}

static int read_pull_group(struct gshmd_cluster *cl, const char *group) {
  struct group *g;

  if (!group || !*group)
    return 0;
  if (!(g = getgrnam(group))) {
    gshm_log_err("cluster.pull_group '%s' does not exist", group);
    return -EINVAL;
  }
  cl->have_pull_gid = true;
  cl->pull_gid = g->gr_gid;
  snprintf(cl->pull_refused, sizeof(cl->pull_refused),
           "listing and pulling peers' segments needs membership in cluster.pull_group ('%s')",
           group);
  return 0;
}

int gshmd__cluster_conf(struct gshmd_cluster *cl) {
  const struct gshmd_config *cfg = cl->cfg;
  struct links *ll = &cl->ll;
  const char *why;
  int e;

  if (cfg->cluster_node_name && *cfg->cluster_node_name)
    snprintf(ll->node_name, sizeof(ll->node_name), "%s", cfg->cluster_node_name);
  else if (gethostname(ll->node_name, sizeof(ll->node_name) - 1) < 0)
    strcpy(ll->node_name, "localhost");
  if (!gshmd__cluster_name_ok(ll->node_name)) {
    gshm_log_err("cluster.node_name '%s': " GSHMD_CLUSTER_NAME_RULE, ll->node_name);
    return -EINVAL;
  }
  ll->listen = cfg->cluster_listen;
  if (ll->listen && *ll->listen &&
      gshmd__cluster_parse_address(ll->listen, &ll->listen_sa, &ll->listen_salen, &why)) {
    gshm_log_err("cluster.listen '%s': %s", ll->listen, why);
    return -EINVAL;
  }
  if ((e = parse_peers(ll, cfg->cluster_peers)) || (e = parse_exports(cl, cfg->cluster_export)) ||
      (e = read_secret(cl, cfg->cluster_secret_file)) ||
      (e = read_pull_group(cl, cfg->cluster_pull_group)))
    return e;
  return 0;
}

int gshmd__cluster_listen_check(const struct links *ll) {
  int fd, one = 1, e = 0;

  if (!ll->listen || !*ll->listen)
    return 0;
  fd = socket(ll->listen_sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0; /* the listener's own setup says what is wrong */
  /* SO_REUSEADDR as a listener sets it: a port in TIME_WAIT (a gshmd
   * that just died) binds, a port something listens on does not */
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      bind(fd, (const struct sockaddr *)&ll->listen_sa, ll->listen_salen) < 0 &&
      errno == EADDRINUSE) {
    gshm_log_err("cluster.listen %s: the port is in use (another gshmd, or another program, "
                 "listens there)",
                 ll->listen);
    e = -EADDRINUSE;
  }
  close(fd);
  return e;
}

char *gshmd__peer_error(const struct peer_req *req, int err, const Gshm__Cluster__Msg *m,
                        const char *why, char *buf, size_t size) {
  const struct peer *p = req->peer;
  bool unreachable = err == -ECONNREFUSED || err == -ECONNRESET || err == -ETIMEDOUT ||
                     err == -ENOTCONN || err == -EHOSTUNREACH || err == -ENETUNREACH;

  char named[80];
  size_t n = (size_t)snprintf(named, sizeof(named), "peer '%s' ", p->name);

  if (m || req->answered) /* the peer answered (a refusal too): its own words */
    snprintf(buf, size, "peer '%s': %s", p->name, why);
  else if (!unreachable && n < sizeof(named) && !strncmp(why, named, n))
    /* the link's own error names the peer already ("peer 'x' did not
     * prove the shared key"): once, with its address */
    snprintf(buf, size, "peer '%s' (%s) %s", p->name, p->address, why + n);
  else
    snprintf(buf, size, "peer '%s' (%s)%s: %s", p->name, p->address,
             !unreachable ? "" : req->sent ? " lost" : " unreachable", why);
  gshm__text_clean(buf);
  return buf;
}
