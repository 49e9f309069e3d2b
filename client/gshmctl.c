/* SPDX-License-Identifier: Apache-2.0 */
/* gshmctl: show and manage what gshmd shares.  A libgshm client itself.
 *
 * Exit codes (docs/ARCHITECTURE.md "Configuration, metrics, tools"): 0 ok,
 * 1 error, 2 usage, 3 daemon unreachable, 4 permission denied, 5 not found. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "gshm.h"
#include "util.h"

#define SCHEMA_VERSION 1
#define CHUNK (4u << 20)

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_DENIED = 4,
       EXIT_NOTFOUND = 5 };

static const char *socket_path;
static int json_out;
/* "--" came: what follows it is a name or a value, never an option */
static bool args_literal;

static void usage(FILE *f) {
  fprintf(f,
          "usage: gshmctl [--socket PATH] [--json] VERB [ARGS]\n"
          "\n"
          "Show and manage the segments that gshmd shares.\n"
          "\n"
          "Verbs:\n"
          "  status                         daemon version, totals and backends\n"
          "  segments                       every segment you may see\n"
          "  mappings                       every lease: segment, pid, uid, client, access, devices\n"
          "                                 (the GPU UUIDs it is mapped on, cpu: mapped on the CPU\n"
          "                                 only, -: not mapped); --json: \"mapped\", \"cpu\" (true\n"
          "                                 where the table says cpu), \"devices\" (GPU UUIDs only)\n"
          "  clients                        every client connection\n"
          "  devices                        GPUs, memory, and the P2P / NVLink matrix\n"
          "  metrics                        Prometheus text exposition (--json: one\n"
          "                                 string, key \"text\")\n"
          "  create NAME SIZE [--location LOC] [--mode MODE] [--legacy-ipc]\n"
          "                                 SIZE in bytes or with K/M/G/T (K = KB = KiB = 1024);\n"
          "                                 LOC host (default),\n"
          "                                 cuda:N or cuda:GPU-<uuid>; MODE octal, default 0600;\n"
          "                                 --legacy-ipc: also export a device segment as a\n"
          "                                 cudaIpcMemHandle (gshmd's daemon.legacy_ipc)\n"
          "  unlink NAME                    remove the name; memory goes with the last lease\n"
          "  chmod NAME MODE                change permission bits (owner or admin)\n"
          "  chown NAME [USER][:GROUP]      change owner (admin) and/or group\n"
          "  revoke NAME | --id ID          admin: end every lease and unlink (--id: a\n"
          "                                 segment without a name, as 'segments' shows it)\n"
          "  read NAME [--offset B] [--length B] [-o FILE]\n"
          "                                 segment bytes to stdout or FILE (default: up to\n"
          "                                 the size asked for at create); --json needs -o;\n"
          "                                 a terminal needs -o (-o -: stdout all the same)\n"
          "  write NAME [-i FILE] [--offset B]\n"
          "                                 bytes from stdin or FILE into the segment; an input\n"
          "                                 that does not fit changes nothing (a pipe's bytes\n"
          "                                 wait in a file in $TMPDIR, else /tmp, until it ends)\n"
          "  peers                          the cluster's peer nodes and their state;\n"
          "                                 EXPORTED: segments an up peer exports now, - for\n"
          "                                 a peer not up (--json: \"exported\" null, and\n"
          "                                 \"exported_last_seen\" the count last known);\n"
          "                                 PROTO, SUBKEYS: the protocol an up peer announced,\n"
          "                                 whether its link uses the key's subkeys (2.6 and\n"
          "                                 yes on every node before cluster.min_protocol=2.6);\n"
          "                                 then the pulls in flight: NAME the peer's segment\n"
          "                                 or prefix, LOCAL where it lands here (--as)\n"
          "  segments --peer PEER           the segments peer node PEER exports\n"
          "  pull PEER:NAME [--as LOCAL] [--prefix] [--replace] [--location LOC]\n"
          "       [--mode MODE]             copy a peer's segment into a new local one;\n"
          "                                 --prefix: every segment it exports under NAME\n"
          "                                 (PEER: --prefix, an empty NAME: all it exports),\n"
          "                                 all appearing at once (--as: local prefix); a\n"
          "                                 '*' ending NAME or --as is dropped (llama/* is\n"
          "                                 llama/), other glob characters are refused;\n"
          "                                 PEER,PEER2,...: the set's segments from\n"
          "                                 several holders, each from the least busy;\n"
          "                                 --replace: swap out local segments of those\n"
          "                                 names; LOC default: host for a host segment,\n"
          "                                 cuda:0 for a device one (with --prefix, LOC\n"
          "                                 moves the device segments only); MODE octal,\n"
          "                                 default 0600\n"
          "                                 (progress on a terminal; --json: one summary)\n"
          "  help [VERB]                    this text; with VERB, that verb's usage\n"
          "\n"
          "Options:\n"
          "  -s, --socket PATH   gshmd's socket (default $GSHM_SOCKET, else %s)\n"
          "  -j, --json          one JSON document with a schema_version key\n"
          "  -h, --help          this text; after a VERB (or 'help VERB'), that verb's\n"
          "                      usage\n"
          "  -V, --version       gshmctl's version\n"
          "  --                  the end of options: what follows is a name or a value\n"
          "                      (gshmctl unlink -- --help)\n"
          "\n"
          "Exit status: 0 ok, 1 error, 2 usage, 3 daemon unreachable, 4 permission denied,\n"
          "5 not found; 130 (143) a pull cancelled by SIGINT, Ctrl-C (SIGTERM).\n",
          GSHM_DEFAULT_SOCKET);
}

/* "gshmctl VERB --help": the lines of usage() that describe verb (its
 * entry under "Verbs:" and their continuation lines; "segments" has two
 * entries), on stdout.  Returns EXIT_OK. */
static int verb_usage(const char *verb) {
  char *text = NULL, *line, *save = NULL;
  size_t len = 0, vlen = strlen(verb);
  FILE *f = open_memstream(&text, &len);
  bool in = false;

  if (!f)
    return EXIT_ERR;
  usage(f);
  fclose(f);
  printf("usage: gshmctl [--socket PATH] [--json] %s ...\n", verb);
  for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (!strncmp(line, "  ", 2) && line[2] != ' ')
      in = !strncmp(line + 2, verb, vlen) && line[2 + vlen] == ' ';
    else if (strncmp(line, "  ", 2))
      in = false;
    if (in)
      puts(line);
  }
  printf("(gshmctl --help: every verb, the options and the exit codes)\n");
  free(text);
  return EXIT_OK;
}

static int exit_code(int err) {
  switch (-err) {
  case 0:
    return EXIT_OK;
  case EACCES:
  case EPERM:
    return EXIT_DENIED;
  case ENOENT:
    return EXIT_NOTFOUND;
  case EINVAL:
    return EXIT_ERR;
  default:
    return EXIT_ERR;
  }
}

/* Reports an error on stderr and returns rc (the exit status).  err is the
 * negative errno behind it, or 0.  With --json the report is one JSON
 * object (README "gshmctl --json"):
 *   {"schema_version": 1, "error": {"exit_code": 5, "errno": "ENOENT",
 *    "message": "open: no such segment"}}
 * ("errno" is null when there is none); else "gshmctl: MESSAGE". */
static json_t *json_text(const char *text);

/* The "errno" of a --json error: libgshm's name for it (one name per
 * value: "ENOTSUP", never "EOPNOTSUPP"), glibc's for one that libgshm
 * does not return itself (a failed write of the output), NULL for 0. */
static const char *errno_name(int err) {
  const char *name;

  if (!err)
    return NULL;
  name = gshm_err_name(err);
  return strcmp(name, "E?") ? name : strerrorname_np(err < 0 ? -err : err);
}

/* Writes doc (taken) and a newline to f.  jansson escapes C0 controls
 * only: a C1 CSI (U+009B) or a bidi override in a name another user chose
 * reached the terminal raw, in valid JSON; they go as \u escapes.  Reals
 * with 15 significant digits (%.15g, which every decimal of up to 15
 * digits survives): jansson's default 17 wrote 0.005577662 s as
 * 0.0055776619999999997.  Returns 0 or -1. */
static int dump_json(json_t *doc, FILE *f, size_t flags) {
  char *text = json_dumps(doc, flags | JSON_REAL_PRECISION(15)), *safe = text ? gshm__json_escape_unprintable(text) : NULL;
  int e = safe && fputs(safe, f) >= 0 && fputc('\n', f) != EOF ? 0 : -1;

  free(safe);
  free(text);
  json_decref(doc);
  return e;
}

static int errorf(int rc, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errorf(int rc, int err, const char *fmt, ...) {
  char msg[1024];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (json_out) {
    const char *name = errno_name(err);
    json_t *doc = json_object(), *e = json_object();
    json_object_set_new(doc, "schema_version", json_integer(SCHEMA_VERSION));
    json_object_set_new(e, "exit_code", json_integer(rc));
    json_object_set_new(e, "errno", name ? json_string(name) : json_null());
    json_object_set_new(e, "message", json_text(msg));
    json_object_set_new(doc, "error", e);
    dump_json(doc, stderr, JSON_COMPACT | JSON_PRESERVE_ORDER);
  } else {
    /* the message echoes the user's own argv (a name, an option, a
     * value) and gshmd's words about it: escaped as the tables escape
     * names, so that an ESC, a CR or a bidi control in them cannot
     * rewrite the terminal of whoever runs the script */
    char safe[4 * sizeof(msg) + 1];
    fprintf(stderr, "gshmctl: %s\n", gshm__escape_text(msg, safe, sizeof(safe)));
  }
  return rc;
}

/* Prints one line of a verb's output (fmt without its newline; up to 2047
 * bytes once formatted) to stdout, all of it escaped as the tables escape
 * names (gshm__escape_text): the names, peers and values it echoes are
 * the user's own argv or another user's choosing, and an ESC, a CR or a
 * bidi control in them must not reach the terminal raw. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char text[2048], safe[4 * sizeof(text) + 1];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  printf("%s\n", gshm__escape_text(text, safe, sizeof(safe)));
}

/* Whether every name of peer ("a" or "a,b,...") is one of v[n]'s. */
static bool all_known(const char *peer, const gshm_cluster_peer_t *v, size_t n) {
  for (const char *at = peer; at;) {
    const char *comma = strchr(at, ',');
    size_t len = comma ? (size_t)(comma - at) : strlen(at), i = 0;
    while (i < n && (strlen(v[i].name) != len || strncmp(v[i].name, at, len)))
      i++;
    if (i == n)
      return false;
    at = comma ? comma + 1 : NULL;
  }
  return true;
}

/* After a call that named peer failed with err: when gshmd knows no peer
 * of that name (-ENOENT; of a list "a,b", one of them), the ones it
 * knows, " (this node's peers: a, b)", in buf; else "".  Asks gshmd:
 * gshm_last_error(c) changes. */
static const char *peer_hint(gshm_client_t *c, int err, const char *peer, char *buf, size_t cap) {
  gshm_cluster_peer_t *v = NULL;
  char node[64];
  size_t n = 0, o;

  buf[0] = '\0';
  if (err != -ENOENT || !peer || gshm_cluster_peers(c, node, &v, &n))
    return buf;
  if (all_known(peer, v, n)) { /* (a list "a,b": each of them) */
    gshm_free(v);
    return buf;
  }
  o = (size_t)snprintf(buf, cap, "%s", n ? " (this node's peers: " : " (this node has no peers)");
  for (size_t i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%s%s", i ? ", " : "", v[i].name,
                          i + 1 == n ? ")" : "");
  gshm_free(v);
  return buf;
}

/* For a pull refused with -EEXIST (a local segment holds the name): the
 * way out, in this program's words.  gshmd's message names no option,
 * libgshm serving C, Python and gshmctl alike; an older gshmd's already
 * named --replace. */
static const char *replace_hint(int err, bool replace, const char *why) {
  return err == -EEXIST && !replace && !strstr(why, "--replace") ? " (replace it with --replace)"
                                                                  : "";
}

/* gshmd says only "permission denied" to a user who may not see the
 * segment (an error must not reveal what `segments` hides): what that
 * means for verb `what`, and who can change it, in buf ("" for other
 * verbs). */
static const char *hidden_segment_hint(const char *what, char *buf, size_t cap) {
  bool access = !strcmp(what, "read") || !strcmp(what, "write");
  bool manage = !strcmp(what, "unlink") || !strcmp(what, "chmod") || !strcmp(what, "chown");

  buf[0] = '\0';
  if (access || manage)
    snprintf(buf, cap, ": uid %u may not see a segment of that name; if there is one, %s",
             (unsigned)geteuid(),
             access ? "its owner or an admin can open it to this user (gshmctl chmod, chown)"
                    : "only its owner or an admin may change it");
  return buf;
}

/* What to do after gshmd's own explanation of err for verb `what`, in
 * this program's words (a name that exists; a segment this user may see
 * but not use so, or not change; a peer gshmd does not know), or "". */
static const char *way_out(gshm_client_t *c, const char *what, int err, const char *peer,
                           char *buf, size_t cap) {
  if (err == -EEXIST && !strcmp(what, "create"))
    return " (choose another name, or gshmctl unlink it first: whoever holds it keeps its bytes "
           "until they close it)";
  if (err == -EACCES && (!strcmp(what, "read") || !strcmp(what, "write")))
    return " (its owner or an admin can open it to this user: gshmctl chmod, chown)";
  if (err == -EACCES && (!strcmp(what, "unlink") || !strcmp(what, "chmod")))
    return " (only its owner or an admin may)";
  return c ? peer_hint(c, err, peer, buf, cap) : "";
}

/* Reports a failed call (of a verb that named peer, or NULL); returns rc,
 * the exit code. */
static int fail_peer(gshm_client_t *c, const char *what, int err, const char *peer, int rc) {
  char detail[1024], hint[512];
  /* gshmd's answer about a peer: the peer's failure, not the local
   * gshmd's ("connection to gshmd reset" for a peer that is down) */
  const char *text = peer && c && strcmp(gshm_last_error(c), GSHM_LOST_GSHMD_TEXT)
                         ? gshm__peer_failure_text(err) : gshm_strerror(err);

  snprintf(detail, sizeof(detail), "%s", c ? gshm_last_error(c) : "");
  /* gshmd's whole explanation may be the error's own text ("permission
   * denied" to a user who may not see the segment): say it once, and
   * what it means. */
  if (strcasecmp(detail, gshm_strerror(err)) == 0) {
    detail[0] = '\0';
    if (err == -EACCES)
      return errorf(rc, err, "%s: %s%s", what, gshm_strerror(err),
                    hidden_segment_hint(what, hint, sizeof(hint)));
  }
  return errorf(rc, err, "%s: %s%s%s%s", what, text, *detail ? ": " : "", detail,
                way_out(c, what, err, peer, hint, sizeof(hint)));
}

static int fail(gshm_client_t *c, const char *what, int err) {
  return fail_peer(c, what, err, NULL, exit_code(err));
}

/* A verb's getopt_long returned o, '?' or ':' (opterr is 0 and the
 * option strings start with ':', so getopt says nothing itself): names the
 * option that is not one, the one that lacks its value (':'), and a
 * negative number as such.  Returns EXIT_USAGE. */
static int bad_option(const char *verb, int o, char **argv) {
  const char *arg = argv[optind - 1] ? argv[optind - 1] : "?";
  char letter[3] = {'-', (char)optopt, '\0'};
  bool negative;

  if (o == ':')
    return errorf(EXIT_USAGE, -EINVAL, "%s: option '%s' needs a value", verb, arg);
  /* A short option: getopt may still be inside its argument ("-4K" stops
   * at '4' before optind moves past it, so argv[optind - 1] is the word
   * before): name the argument that starts with the letter, or the letter. */
  if (optopt) {
    arg = letter;
    for (char **a = argv + 1; *a; a++)
      if ((*a)[0] == '-' && (*a)[1] == optopt) {
        arg = *a;
        break;
      }
  }
  negative = arg[0] == '-' && arg[1] >= '0' && arg[1] <= '9';
  return errorf(EXIT_USAGE, -EINVAL, "%s: %s '%s'%s", verb,
                negative ? "not a size or offset:" : "unknown option", arg,
                negative ? " (sizes and offsets cannot be negative)" : "");
}

static int connect_daemon(gshm_client_t **c) {
  int e = gshm_connect(socket_path, "gshmctl", c);
  if (e) {
    const char *env = socket_path ? socket_path : secure_getenv("GSHM_SOCKET");
    const char *path = env && *env ? env : GSHM_DEFAULT_SOCKET;
    char why[1024];

    gshm_connect_explain(path, e, why, sizeof(why)); /* a cut text is still worth printing */
    return errorf(e == -EACCES ? EXIT_DENIED : EXIT_UNREACHABLE, e, "cannot reach gshmd at %s: %s",
                  path, why);
  }
  return 0;
}

static const char *rfc3339(int64_t ns, char *buf, size_t cap) {
  time_t t = (time_t)(ns / 1000000000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

static const char *age(int64_t ns, char *buf, size_t cap) {
  int64_t s = (gshm__now_ns(CLOCK_REALTIME) - ns) / 1000000000;
  if (s < 0)
    s = 0;
  if (s < 120)
    snprintf(buf, cap, "%" PRId64 "s", s);
  else if (s < 7200)
    snprintf(buf, cap, "%" PRId64 "m", s / 60);
  else if (s < 172800)
    snprintf(buf, cap, "%" PRId64 "h", s / 3600);
  else
    snprintf(buf, cap, "%" PRId64 "d", s / 86400);
  return buf;
}

/* A JSON string of text that may not be UTF-8 (segment and client names
 * are bytes): invalid bytes become U+FFFD instead of the key vanishing
 * (json_string returns NULL for them). */
static json_t *json_text(const char *text) {
  json_t *j = json_string(text);
  size_t n = strlen(text), o = 0;
  char *fixed;

  if (j || !(fixed = malloc(3 * n + 1)))
    return j;
  for (size_t i = 0; i < n;) {
    /* the longest valid UTF-8 sequence at i, 0 if none */
    unsigned char b = (unsigned char)text[i];
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3
                 : (b & 0xF8) == 0xF0 ? 4 : 0;
    json_t *probe;
    char seq[5] = {0};
    if (len && i + len <= n) {
      memcpy(seq, text + i, len);
      if ((probe = json_string(seq))) {
        json_decref(probe);
        memcpy(fixed + o, seq, len);
        o += len;
        i += len;
        continue;
      }
    }
    memcpy(fixed + o, "\xEF\xBF\xBD", 3); /* U+FFFD */
    o += 3;
    i++;
  }
  fixed[o] = '\0';
  j = json_string(fixed);
  free(fixed);
  return j;
}

static int print_json(json_t *doc) {
  return dump_json(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) ? EXIT_ERR : EXIT_OK;
}

static json_t *json_doc(void) {
  json_t *doc = json_object();
  json_object_set_new(doc, "schema_version", json_integer(SCHEMA_VERSION));
  return doc;
}

/* A segment's identity in JSON, in o (the fields every listing and create
 * shares, in this order): name, id, generation, size, requested_size,
 * location. */
static void json_segment_identity(json_t *o, const gshm_segment_info_t *i) {
  json_object_set_new(o, "name", json_text(i->name));
  json_object_set_new(o, "id", json_integer((json_int_t)i->id));
  json_object_set_new(o, "generation", json_integer((json_int_t)i->generation));
  json_object_set_new(o, "size", json_integer((json_int_t)i->size));
  json_object_set_new(o, "requested_size", json_integer((json_int_t)i->requested_size));
  json_object_set_new(o, "location", json_string(i->location));
}

/* StatusInfo.gpu_fault (gshm.h) in words: a sticky CUDA error at gshmd's
 * start ("<PCI bus id>: <CUDA error name>"), or its CUDA driver that did
 * not start ("no driver: <why>"); gpu_fault_why drops that prefix. */
static const char *gpu_fault_what(const char *fault) {
  return strncmp(fault, GSHM_GPU_FAULT_NO_DRIVER, strlen(GSHM_GPU_FAULT_NO_DRIVER))
             ? "a sticky CUDA error at gshmd's start"
             : "the CUDA driver did not start with gshmd";
}

static const char *gpu_fault_why(const char *fault) {
  size_t n = strlen(GSHM_GPU_FAULT_NO_DRIVER);
  return strncmp(fault, GSHM_GPU_FAULT_NO_DRIVER, n) ? fault : fault + n;
}

static int cmd_status(gshm_client_t *c) {
  gshm_status_info_t st;
  char t[40], sz[32];
  int e = gshm_status(c, &st);

  if (e)
    return fail(c, "status", e);
  if (json_out) {
    json_t *doc = json_doc();
    json_object_set_new(doc, "version", json_string(st.version));
    json_object_set_new(doc, "pid", json_integer(st.pid));
    json_object_set_new(doc, "started", json_string(rfc3339(st.started_ns, t, sizeof(t))));
    json_object_set_new(doc, "clients", json_integer(st.clients));
    json_object_set_new(doc, "segments", json_integer(st.segments));
    json_object_set_new(doc, "leases", json_integer(st.leases));
    json_object_set_new(doc, "bytes", json_integer((json_int_t)st.bytes));
    json_object_set_new(doc, "devices", json_integer(st.devices));
    json_object_set_new(doc, "backends", json_string(st.backends));
    json_object_set_new(doc, "gpu_fault", *st.gpu_fault ? json_string(st.gpu_fault) : json_null());
    return print_json(doc);
  }
  printf("gshmd %s, pid %d, up since %s\n", st.version, st.pid,
         rfc3339(st.started_ns, t, sizeof(t)));
  printf("backends: %s (%u GPU%s)\n", st.backends, st.devices, st.devices == 1 ? "" : "s");
  if (*st.gpu_fault)
    printf("GPUs unusable: %s (%s); device segments are parked (listed, not opened) and device "
           "creates refused until the GPUs work again and gshmd restarts\n",
           gpu_fault_what(st.gpu_fault), gpu_fault_why(st.gpu_fault));
  printf("%u client%s, %u segment%s (%s), %u lease%s\n", st.clients, gshm__plural(st.clients),
         st.segments, gshm__plural(st.segments), gshm__format_size(st.bytes, sz, sizeof(sz)),
         st.leases, gshm__plural(st.leases));
  return EXIT_OK;
}

/* Names in table output come from other users (segment and client names,
 * mapped devices): control characters, C1 bytes and bidi overrides in
 * them must not reach the terminal raw: another user could rewrite what
 * the admin sees or move the cursor.  JSON output escapes on its own. */
#define SHOWN_CAP (4 * 4096 + 1)
static const char *shown(const char *text, char buf[SHOWN_CAP]) {
  return gshm__escape_text(text, buf, SHOWN_CAP);
}

/* printf's width for shown text s in a column of w characters: %-28s pads
 * by bytes, so a name with multibyte UTF-8 characters ("café") ended its
 * column short and pushed the next ones left.  Counts code points (a wide
 * CJK character takes two cells: not counted). */
static int col(const char *s, int w) {
  int extra = 0;
  for (; *s; s++)
    extra += ((unsigned char)*s & 0xC0) == 0x80;
  return w + extra;
}

/* The width of a column of at least w characters that also holds text
 * (escaped as shown): a name longer than its column widens the column
 * for every row, rather than pushing the later columns of its own row
 * out of line. */
static int widen(int w, const char *text) {
  static char buf[SHOWN_CAP];
  int n = 0;
  for (const char *p = shown(text, buf); *p; p++)
    n += ((unsigned char)*p & 0xC0) != 0x80;
  return n > w ? n : w;
}

static int cmd_remote_segments(gshm_client_t *c, const char *peer);

/* The SIZE of a segment's row, local or a peer's (segments --peer): the
 * bytes allocated (the size asked for rounded up to the granularity), so
 * that a segment reads the same on its node and from a peer. */
static const char *size_cell(const gshm_segment_info_t *i, char *buf, size_t cap) {
  return gshm__format_size(i->size, buf, cap);
}

static int cmd_segments(gshm_client_t *c, int argc, char **argv) {
  static char esc[SHOWN_CAP], esc2[SHOWN_CAP];
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  char t[40], sz[32], mode[8];
  int e;

  if (argc == 3 && !strcmp(argv[1], "--peer") && *argv[2])
    return cmd_remote_segments(c, argv[2]);
  if (argc == 2 && !strncmp(argv[1], "--peer=", 7) && argv[1][7])
    return cmd_remote_segments(c, argv[1] + 7);
  if (argc != 1) {
    return errorf(EXIT_USAGE, -EINVAL, "usage: segments [--peer PEER]");
  }
  if (!c)
    return EXIT_OK;
  if ((e = gshm_list(c, &v, &n)))
    return fail(c, "segments", e);
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object();
      snprintf(mode, sizeof(mode), "%04o", v[i].mode);
      json_segment_identity(o, &v[i]);
      json_object_set_new(o, "device", v[i].device_index < 0 ? json_null()
                                                             : json_integer(v[i].device_index));
      json_object_set_new(o, "uid", json_integer(v[i].uid));
      json_object_set_new(o, "gid", json_integer(v[i].gid));
      json_object_set_new(o, "mode", json_string(mode));
      json_object_set_new(o, "state", json_string(v[i].unlinked ? "unlinked" : "live"));
      json_object_set_new(o, "leases", json_integer(v[i].leases));
      json_object_set_new(o, "legacy_ipc", json_boolean(v[i].flags & GSHM_CREATE_LEGACY_IPC));
      json_object_set_new(o, "created", json_string(rfc3339(v[i].created_ns, t, sizeof(t))));
      json_object_set_new(o, "source", v[i].source[0] ? json_text(v[i].source) : json_null());
      json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "segments", arr);
    gshm_free(v);
    return print_json(doc);
  }
  int wn = 28;
  for (size_t i = 0; i < n; i++)
    wn = widen(wn, v[i].name);
  printf("%-6s %-*s %10s %-10s %6s %6s %4s %-8s %6s %s\n", "ID", wn, "NAME", "SIZE", "LOCATION",
         "UID", "GID", "MODE", "STATE", "LEASES", "AGE");
  for (size_t i = 0; i < n; i++) {
    char loc[16];
    if (v[i].device_index >= 0)
      snprintf(loc, sizeof(loc), "cuda:%d", v[i].device_index);
    else
      snprintf(loc, sizeof(loc), "host");
    shown(v[i].name, esc);
    printf("%-6" PRIu64 " %-*s %10s %-10s %6u %6u %04o %-8s %6u %s%s%s\n", v[i].id,
           col(esc, wn), esc,
           size_cell(&v[i], sz, sizeof(sz)), loc, v[i].uid, v[i].gid, v[i].mode,
           v[i].unlinked ? "unlinked" : "live", v[i].leases, age(v[i].created_ns, t, sizeof(t)),
           v[i].source[0] ? "  from " : "", shown(v[i].source, esc2));
  }
  gshm_free(v);
  return EXIT_OK;
}

static int cmd_mappings(gshm_client_t *c) {
  static char esc[SHOWN_CAP], esc2[SHOWN_CAP], esc3[SHOWN_CAP];
  gshm_lease_info_t *v = NULL;
  size_t n = 0;
  char t[40];
  int e = gshm_list_leases(c, &v, &n);

  if (e)
    return fail(c, "mappings", e);
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object(), *devs = json_array();
      const char *p = v[i].mapped_devices;
      while (*p) {
        size_t k = strcspn(p, ",");
        json_array_append_new(devs, json_stringn(p, k));
        p += k + (p[k] == ',');
      }
      json_object_set_new(o, "segment", json_text(v[i].segment_name));
      json_object_set_new(o, "segment_id", json_integer((json_int_t)v[i].segment_id));
      json_object_set_new(o, "lease_id", json_integer((json_int_t)v[i].lease_id));
      json_object_set_new(o, "location", json_string(v[i].location));
      json_object_set_new(o, "pid", json_integer(v[i].pid));
      json_object_set_new(o, "uid", json_integer(v[i].uid));
      json_object_set_new(o, "client", json_text(v[i].client_name));
      json_object_set_new(o, "session_id", json_integer((json_int_t)v[i].session_id));
      json_object_set_new(o, "access", json_string(v[i].access == GSHM_ACCESS_READ ? "r" : "rw"));
      json_object_set_new(o, "since", json_string(rfc3339(v[i].since_ns, t, sizeof(t))));
      json_object_set_new(o, "mapped", json_boolean(v[i].mapped));
      /* the table's "cpu": mapped, and on no GPU ("devices" lists GPUs only) */
      json_object_set_new(o, "cpu", json_boolean(v[i].mapped && !*v[i].mapped_devices));
      json_object_set_new(o, "devices", devs);
      /* ("devices" lists the first ones only: those libgshm's struct holds) */
      json_object_set_new(o, "devices_total", json_integer(v[i].mapped_devices_total));
      json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "mappings", arr);
    gshm_free(v);
    return print_json(doc);
  }
  int ws = 28, wc = 16;
  for (size_t i = 0; i < n; i++) {
    ws = widen(ws, v[i].segment_name);
    wc = widen(wc, v[i].client_name);
  }
  printf("%-*s %8s %6s %-*s %-6s %-6s %-6s %s\n", ws, "SEGMENT", "PID", "UID", wc, "CLIENT",
         "ACCESS", "SINCE", "MAPPED", "DEVICES");
  for (size_t i = 0; i < n; i++) {
    char more[32] = "";
    shown(v[i].segment_name, esc);
    shown(v[i].client_name, esc2);
    if (v[i].mapped && v[i].mapped_devices_total > v[i].mapped_devices_listed)
      snprintf(more, sizeof(more), " (+%u more)",
               v[i].mapped_devices_total - v[i].mapped_devices_listed);
    printf("%-*s %8d %6u %-*s %-6s %-6s %-6s %s%s\n", col(esc, ws), esc, v[i].pid, v[i].uid,
           col(esc2, wc), esc2, v[i].access == GSHM_ACCESS_READ ? "r" : "rw",
           age(v[i].since_ns, t, sizeof(t)), v[i].mapped ? "yes" : "no",
           !v[i].mapped ? "-" : *v[i].mapped_devices ? shown(v[i].mapped_devices, esc3) : "cpu",
           more);
  }
  gshm_free(v);
  return EXIT_OK;
}

static int cmd_clients(gshm_client_t *c) {
  static char esc[SHOWN_CAP];
  gshm_client_info_t *v = NULL;
  size_t n = 0;
  char t[40];
  int e = gshm_list_clients(c, &v, &n);

  if (e)
    return fail(c, "clients", e);
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object();
      json_object_set_new(o, "session_id", json_integer((json_int_t)v[i].session_id));
      json_object_set_new(o, "pid", json_integer(v[i].pid));
      json_object_set_new(o, "uid", json_integer(v[i].uid));
      json_object_set_new(o, "gid", json_integer(v[i].gid));
      json_object_set_new(o, "name", json_text(v[i].name));
      json_object_set_new(o, "since", json_string(rfc3339(v[i].since_ns, t, sizeof(t))));
      json_object_set_new(o, "leases", json_integer(v[i].leases));
      json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "clients", arr);
    gshm_free(v);
    return print_json(doc);
  }
  int wn = 20;
  for (size_t i = 0; i < n; i++)
    wn = widen(wn, v[i].name);
  printf("%-8s %8s %6s %6s %-*s %-6s %s\n", "SESSION", "PID", "UID", "GID", wn, "NAME", "SINCE",
         "LEASES");
  for (size_t i = 0; i < n; i++) {
    shown(v[i].name, esc);
    printf("%-8" PRIu64 " %8d %6u %6u %-*s %-6s %u\n", v[i].session_id, v[i].pid, v[i].uid,
           v[i].gid, col(esc, wn), esc, age(v[i].since_ns, t, sizeof(t)), v[i].leases);
  }
  gshm_free(v);
  return EXIT_OK;
}

/* One GPU of `devices --json`, its peers' access included. */
static json_t *device_json(const gshm_device_info_t *d) {
  json_t *o = json_object(), *peers = json_array();

  json_object_set_new(o, "index", json_integer(d->index));
  json_object_set_new(o, "uuid", json_string(d->uuid));
  json_object_set_new(o, "pci_bus_id", json_string(d->pci_bus_id));
  json_object_set_new(o, "name", json_text(d->name));
  json_object_set_new(o, "total_memory", json_integer((json_int_t)d->total_memory));
  json_object_set_new(o, "free_memory", json_integer((json_int_t)d->free_memory));
  json_object_set_new(o, "granularity", json_integer((json_int_t)d->granularity));
  json_object_set_new(o, "compute_capability", json_sprintf("%d.%d", d->cc_major, d->cc_minor));
  for (int k = 0; k < d->npeers; k++) {
    json_t *p = json_object();
    json_object_set_new(p, "index", json_integer(d->peers[k].index));
    json_object_set_new(p, "access", json_boolean(d->peers[k].access));
    json_object_set_new(p, "native_atomics", json_boolean(d->peers[k].native_atomics));
    json_object_set_new(p, "performance_rank", json_integer(d->peers[k].performance_rank));
    json_object_set_new(p, "nvlinks",
                        d->peers[k].nvlinks < 0 ? json_null() : json_integer(d->peers[k].nvlinks));
    json_array_append_new(peers, p);
  }
  json_object_set_new(o, "peers", peers);
  return o;
}

/* The P2P matrix of the n GPUs v, p2pBandwidthLatencyTest style: NV<n>
 * for NVLink, P2P for other peer access, - for none, X for self. */
static void print_p2p_matrix(const gshm_device_info_t *v, size_t n) {
  printf("\nP2P   ");
  for (size_t j = 0; j < n; j++)
    printf(" GPU%-3d", v[j].index);
  printf("\n");
  for (size_t i = 0; i < n; i++) {
    printf("GPU%-3d", v[i].index);
    for (size_t j = 0; j < n; j++) {
      const gshm_peer_info_t *p = NULL;
      char cell[16] = "-";
      for (int k = 0; k < v[i].npeers; k++)
        if (v[i].peers[k].index == v[j].index)
          p = &v[i].peers[k];
      if (i == j)
        strcpy(cell, "X");
      else if (p && p->nvlinks > 0)
        snprintf(cell, sizeof(cell), "NV%d", p->nvlinks);
      else if (p && p->access)
        strcpy(cell, "P2P");
      printf(" %-6s", cell);
    }
    printf("\n");
  }
}

static int cmd_devices(gshm_client_t *c) {
  gshm_device_info_t *v = NULL;
  size_t n = 0;
  char a[32], b[32];
  gshm_status_info_t st = {0};
  int e = gshm_list_devices(c, &v, &n);

  if (e)
    return fail(c, "devices", e);
  if (n == 0 && (e = gshm_status(c, &st))) { /* (why none: its gpu_fault) */
    gshm_free(v);
    return fail(c, "devices", e);
  }
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, device_json(&v[i]));
    json_object_set_new(doc, "devices", arr);
    if (*st.gpu_fault)
      json_object_set_new(doc, "gpu_fault", json_string(st.gpu_fault));
    gshm_free(v);
    return print_json(doc);
  }
  if (n == 0 && *st.gpu_fault)
    printf("no usable GPUs: %s (%s); device segments are parked until the GPUs work again and "
           "gshmd restarts\n", gpu_fault_what(st.gpu_fault), gpu_fault_why(st.gpu_fault));
  else if (n == 0)
    printf("no GPUs: this gshmd serves host segments only\n");
  if (n == 0) {
    gshm_free(v);
    return EXIT_OK;
  }
  printf("%-4s %-42s %-14s %-24s %5s %10s %10s\n", "IDX", "UUID", "PCI", "NAME", "CC", "TOTAL",
         "FREE");
  for (size_t i = 0; i < n; i++)
    printf("%-4d %-42s %-14s %-24s %3d.%d %10s %10s\n", v[i].index, v[i].uuid, v[i].pci_bus_id,
           v[i].name, v[i].cc_major, v[i].cc_minor,
           gshm__format_size(v[i].total_memory, a, sizeof(a)),
           gshm__format_size(v[i].free_memory, b, sizeof(b)));
  print_p2p_matrix(v, n);
  gshm_free(v);
  return EXIT_OK;
}

static int cmd_metrics(gshm_client_t *c) {
  char *text = NULL;
  int e = gshm_metrics(c, &text);
  if (e)
    return fail(c, "metrics", e);
  if (json_out) { /* the exposition text as one string */
    json_t *doc = json_doc();
    json_object_set_new(doc, "text", json_text(text));
    gshm_free(text);
    return print_json(doc);
  }
  fputs(text, stdout);
  gshm_free(text);
  return EXIT_OK;
}

static int parse_bytes(const char *what, const char *s, uint64_t *out) {
  int e = gshm__parse_size(s, out);
  if (e)
    errorf(EXIT_USAGE, e, "%s '%s': %s (" GSHM_SIZE_SYNTAX ")",
           what, s, gshm__size_refusal(s, e));
  return e;
}

/* Mode bits in octal, 0000..0777; prints the usage error for verb `what`.
 * A new segment's mode (create, pull: new) may not be 0: gshm_create and
 * gshmd take 0 for "the default, 0600" (the wire cannot tell them apart),
 * so `--mode 0` gave 0600, silently; it is refused, naming chmod, which
 * does set 0. */
static int parse_mode(const char *what, const char *s, bool new, uint32_t *out) {
  unsigned long v;
  char *end;

  errno = 0;
  v = strtoul(s, &end, 8);
  if (errno || *end || !*s || v > 0777) {
    errorf(EXIT_USAGE, -EINVAL, "%s: mode '%s' is not octal 0000..0777", what, s);
    return -EINVAL;
  }
  if (new && v == 0) {
    errorf(EXIT_USAGE, -EINVAL,
           "%s: --mode 0 cannot be given to a new segment (gshmd takes 0 for its default, 0600): "
           "give another mode, then 'gshmctl chmod NAME 0' to take every access away",
           what);
    return -EINVAL;
  }
  *out = (uint32_t)v;
  return 0;
}

/* --location LOC of verb `what`, checked before gshmd is asked (a usage
 * error, exit 2, as every other): "host", "cuda:N" or "cuda:GPU-<uuid>"
 * ("" is gshmd's default).  Prints the usage error; returns 0 or -EINVAL. */
static int check_location(const char *what, const char *s) {
  struct gshm_location loc;

  if (!gshm__location_parse(s, &loc))
    return 0;
  errorf(EXIT_USAGE, -EINVAL,
         "%s: --location '%s' is not a location: write host, cuda:N (a GPU's index) or "
         "cuda:GPU-<uuid>",
         what, s);
  return -EINVAL;
}

static int cmd_create(gshm_client_t *c, int argc, char **argv) {
  static const struct option opts[] = {{"location", required_argument, NULL, 'l'},
                                       {"mode", required_argument, NULL, 'm'},
                                       {"legacy-ipc", no_argument, NULL, 'L'},
                                       {NULL, 0, NULL, 0}};
  const char *location = "host";
  uint32_t mode = 0600, flags = 0;
  gshm_segment_t *seg;
  uint64_t size;
  char sz[32];
  int o, e;

  optind = 0; /* glibc: 0 re-initialises getopt for the verb's own options */
  while ((o = getopt_long(argc, argv, ":l:m:", opts, NULL)) != -1) {
    switch (o) {
    case 'l':
      if (check_location("create", optarg))
        return EXIT_USAGE;
      location = optarg;
      break;
    case 'm':
      if (parse_mode("create", optarg, true, &mode))
        return EXIT_USAGE;
      break;
    case 'L':
      flags |= GSHM_CREATE_LEGACY_IPC;
      break;
    default:
      return bad_option("create", o, argv);
    }
  }
  if (argc - optind != 2) {
    return errorf(EXIT_USAGE, -EINVAL,
                  "usage: create NAME SIZE [--location LOC] [--mode MODE] [--legacy-ipc]");
  }
  if (parse_bytes("create: size", argv[optind + 1], &size))
    return EXIT_USAGE;
  if (size == 0)
    return errorf(EXIT_USAGE, -EINVAL, "create: size must be at least 1 byte");
  if (!c)
    return EXIT_OK; /* arguments only (see main) */
  if ((e = gshm_create(c, argv[optind], size, location, mode, flags, &seg)))
    return fail(c, "create", e);
  if (json_out) {
    const gshm_segment_info_t *i = gshm_segment_info(seg);
    json_t *doc = json_doc();
    json_segment_identity(doc, i);
    gshm_close(seg);
    return print_json(doc);
  }
  say("created '%s': %s at %s (id %" PRIu64 ")", gshm_segment_info(seg)->name,
      gshm__format_size(gshm_segment_info(seg)->size, sz, sizeof(sz)),
      gshm_segment_info(seg)->location, gshm_segment_info(seg)->id);
  gshm_close(seg);
  return EXIT_OK;
}

/* unlink NAME, revoke NAME: one call on a name, "DONE 'NAME'" or
 * {"schema_version": 1, "name": NAME}. */
/* unlink, chmod, chown and revoke read NAME without getopt: a NAME that
 * starts with '-' (before any "--") is an option they do not take, not a
 * name (a "--bogus" was a segment no one has; "revoke --id=5" revoked a
 * segment named "--id=5", or said "not found" for an id that has one).
 * '-' alone is a name.  Returns 0 or the usage error's exit status
 * (printed, with usage: the verb's usage line). */
static int name_not_option(const char *verb, const char *usage, char **argv) {
  if (args_literal || !argv[1] || argv[1][0] != '-' || !argv[1][1])
    return 0;
  return errorf(EXIT_USAGE, -EINVAL, "%s: unknown option '%s'; usage: %s (a NAME that starts "
                "with '-' goes after '--': gshmctl %s -- NAME)", verb, argv[1], usage, verb);
}

static int cmd_by_name(gshm_client_t *c, int argc, char **argv, const char *verb,
                       int (*fn)(gshm_client_t *, const char *), const char *done) {
  char usage[32];
  int e;

  snprintf(usage, sizeof(usage), "%s NAME", verb);
  if ((e = name_not_option(verb, usage, argv)))
    return e;
  if (argc != 2) {
    return errorf(EXIT_USAGE, -EINVAL, "usage: %s NAME", verb);
  }
  if (!c)
    return EXIT_OK;
  if ((e = fn(c, argv[1])))
    return fail(c, verb, e);
  if (json_out) {
    json_t *doc = json_doc();
    json_object_set_new(doc, "name", json_text(argv[1]));
    return print_json(doc);
  }
  say("%s '%s'", done, argv[1]);
  return EXIT_OK;
}

static int cmd_unlink(gshm_client_t *c, int argc, char **argv) {
  return cmd_by_name(c, argc, argv, "unlink", gshm_unlink, "unlinked");
}

static int cmd_chmod(gshm_client_t *c, int argc, char **argv) {
  uint32_t mode;
  int e;

  if ((e = name_not_option("chmod", "chmod NAME MODE", argv)))
    return e;
  if (argc != 3) {
    return errorf(EXIT_USAGE, -EINVAL, "usage: chmod NAME MODE");
  }
  if (parse_mode("chmod", argv[2], false, &mode))
    return EXIT_USAGE;
  if (!c)
    return EXIT_OK;
  if ((e = gshm_chmod(c, argv[1], mode)))
    return fail(c, "chmod", e);
  if (json_out) {
    json_t *doc = json_doc();
    char m[8];
    snprintf(m, sizeof(m), "%04o", (unsigned)mode);
    json_object_set_new(doc, "name", json_text(argv[1]));
    json_object_set_new(doc, "mode", json_string(m));
    return print_json(doc);
  }
  say("changed the mode of '%s' to %04o", argv[1], (unsigned)mode);
  return EXIT_OK;
}

/* A user or group by name or number; (uint32_t)-1 for "". */
static int parse_id(const char *s, bool group, uint32_t *out) {
  char *end;
  unsigned long v;

  if (!*s) {
    *out = (uint32_t)-1;
    return 0;
  }
  errno = 0;
  v = strtoul(s, &end, 10);
  if (!errno && !*end && v < UINT32_MAX) {
    *out = (uint32_t)v;
    return 0;
  }
  if (group) {
    struct group *g = getgrnam(s);
    if (g) {
      *out = g->gr_gid;
      return 0;
    }
  } else {
    struct passwd *p = getpwnam(s);
    if (p) {
      *out = p->pw_uid;
      return 0;
    }
  }
  errorf(EXIT_NOTFOUND, -ENOENT, "chown: no such %s '%s'", group ? "group" : "user", s);
  return -ENOENT;
}

static int cmd_chown(gshm_client_t *c, int argc, char **argv) {
  char spec[256], *colon;
  uint32_t uid, gid = (uint32_t)-1;
  int e;

  if ((e = name_not_option("chown", "chown NAME [USER][:GROUP]", argv)))
    return e;
  if (argc != 3 || strlen(argv[2]) >= sizeof(spec) || !*argv[2]) {
    return errorf(EXIT_USAGE, -EINVAL, "usage: chown NAME [USER][:GROUP]");
  }
  strcpy(spec, argv[2]);
  if ((colon = strchr(spec, ':'))) {
    *colon = '\0';
    if (parse_id(colon + 1, true, &gid))
      return EXIT_NOTFOUND;
  }
  if (parse_id(spec, false, &uid))
    return EXIT_NOTFOUND;
  if (uid == (uint32_t)-1 && gid == (uint32_t)-1) /* ":" would change nothing */
    return errorf(EXIT_USAGE, -EINVAL, "chown: '%s' names no user and no group: give USER, "
                  ":GROUP or USER:GROUP", argv[2]);
  if (!c)
    return EXIT_OK;
  if ((e = gshm_chown(c, argv[1], uid, gid)))
    return fail(c, "chown", e);
  if (json_out) {
    json_t *doc = json_doc();
    json_object_set_new(doc, "name", json_text(argv[1]));
    json_object_set_new(doc, "uid", uid == (uint32_t)-1 ? json_null() : json_integer(uid));
    json_object_set_new(doc, "gid", gid == (uint32_t)-1 ? json_null() : json_integer(gid));
    return print_json(doc);
  }
  if (uid == (uint32_t)-1)
    say("changed the group of '%s' to %s", argv[1], colon + 1);
  else
    say("changed the owner%s of '%s' to %s", gid == (uint32_t)-1 ? "" : " and group", argv[1],
        gid == (uint32_t)-1 ? spec : argv[2]);
  return EXIT_OK;
}

/* revoke NAME, or revoke --id ID: a segment without a name (unlinked,
 * still held) by the id `segments` shows. */
static int cmd_revoke(gshm_client_t *c, int argc, char **argv) {
  unsigned long long id = 0;
  const char *arg = NULL;
  char *end;
  int e;

  if (argc > 1 && !args_literal && !strcmp(argv[1], "--id"))
    arg = argc == 3 ? argv[2] : NULL;
  else if (argc > 1 && !args_literal && !strncmp(argv[1], "--id=", 5))
    arg = argc == 2 ? argv[1] + 5 : NULL;
  else if ((e = name_not_option("revoke", "revoke NAME | revoke --id ID", argv)))
    return e;
  else if (argc == 2)
    return cmd_by_name(c, argc, argv, "revoke", gshm_revoke, "revoked");
  errno = 0;
  if (arg && isdigit((unsigned char)*arg))
    id = strtoull(arg, &end, 10);
  if (!id || errno || *end)
    return errorf(EXIT_USAGE, -EINVAL, "usage: revoke NAME | revoke --id ID (a segment's id, "
                  "as 'segments' shows it)");
  if (!c)
    return EXIT_OK;
  /* -ESTALE: no segment has that id, which is "not found" to a script */
  if ((e = gshm_revoke_id(c, (uint64_t)id)))
    return fail_peer(c, "revoke", e, NULL, e == -ESTALE ? EXIT_NOTFOUND : exit_code(e));
  if (json_out) {
    json_t *doc = json_doc();
    json_object_set_new(doc, "id", json_integer((json_int_t)id));
    return print_json(doc);
  }
  printf("revoked segment id %llu\n", id);
  return EXIT_OK;
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -errno;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* read and write share their option parsing. */
static int rw_opts(int argc, char **argv, bool is_write, uint64_t *offset, uint64_t *length,
                   bool *have_length, const char **file) {
  static const struct option opts[] = {{"offset", required_argument, NULL, 'O'},
                                       {"length", required_argument, NULL, 'n'},
                                       {"output", required_argument, NULL, 'o'},
                                       {"input", required_argument, NULL, 'i'},
                                       {NULL, 0, NULL, 0}};
  int o;

  optind = 0; /* glibc: 0 re-initialises getopt for the verb's own options */
  while ((o = getopt_long(argc, argv, is_write ? ":i:" : ":o:n:", opts, NULL)) != -1) {
    switch (o) {
    case 'O':
      if (parse_bytes(is_write ? "write: offset" : "read: offset", optarg, offset))
        return EXIT_USAGE;
      break;
    case 'n':
      if (is_write)
        return errorf(EXIT_USAGE, -EINVAL, "write: --length is for read (write takes all input)");
      if (parse_bytes("read: length", optarg, length))
        return EXIT_USAGE;
      *have_length = true;
      break;
    case 'o':
    case 'i':
      if ((o == 'o') == is_write)
        return errorf(EXIT_USAGE, -EINVAL, "%s: %s is for %s", is_write ? "write" : "read",
                      o == 'o' ? "-o/--output" : "-i/--input", is_write ? "read" : "write");
      *file = optarg;
      break;
    default:
      return bad_option(is_write ? "write" : "read", o, argv);
    }
  }
  if (argc - optind != 1) {
    return errorf(EXIT_USAGE, -EINVAL, "usage: %s",
                  is_write ? "write NAME [-i FILE] [--offset B]"
                           : "read NAME [--offset B] [--length B] [-o FILE]");
  }
  return 0;
}

/* The document of a read or write: {"schema_version", "name", "offset",
 * "bytes"}; the caller may add keys, then prints it. */
static json_t *json_transfer(const char *name, uint64_t offset, uint64_t bytes) {
  json_t *doc = json_doc();

  json_object_set_new(doc, "name", json_text(name));
  json_object_set_new(doc, "offset", json_integer((json_int_t)offset));
  json_object_set_new(doc, "bytes", json_integer((json_int_t)bytes));
  return doc;
}

/* Where read's bytes may go: -o FILE (*file), or stdout (*file NULL
 * after, "-o -" included).  Returns 0 or the exit status of a usage
 * error (printed). */
static int read_output(const char **file) {
  /* JSON has no form for raw bytes, and a base64 copy of a segment of
   * gigabytes in one document helps nobody: the bytes go to a file, the
   * document says what was read. */
  if (json_out && (!*file || !strcmp(*file, "-")))
    return errorf(EXIT_USAGE, -EINVAL,
                  "read: --json cannot print a segment's bytes; give -o FILE (the JSON "
                  "document then says what was read)");
  /* Raw bytes on a terminal could move its cursor or rewrite what it
   * shows (a segment another user wrote: its names are escaped for the
   * same reason); "-o -" asks for them there all the same. */
  if (!*file && isatty(STDOUT_FILENO))
    return errorf(EXIT_USAGE, -EINVAL,
                  "read: stdout is a terminal, and a segment's raw bytes could rewrite what it "
                  "shows; give -o FILE, pipe them (gshmctl read NAME | xxd), or -o - to write "
                  "them to the terminal anyway");
  if (*file && !strcmp(*file, "-"))
    *file = NULL;
  return 0;
}

/* An offset past an existing segment's end (offset, size: bytes), for
 * read and write: an error about that segment (EXIT_ERR, as a range that
 * runs past it), not a usage error (EXIT_USAGE is for a command line
 * gshmctl refuses before asking gshmd; only gshmd's answer shows this). */
#define PAST_END_FMT "offset %" PRIu64 " is past the segment's end (%" PRIu64 " bytes)"

/* read -o FILE's temporary file while it is written ("": none), and the
 * handlers of the signals that end gshmctl that read_interrupted replaced
 * meanwhile: a signal handler can use only what was prepared before it. */
static char output_tmp[PATH_MAX];
static struct sigaction output_old[3];
static const int output_signals[3] = {SIGINT, SIGTERM, SIGHUP};

/* SIGINT, SIGTERM or SIGHUP during read -o: removes the temporary file
 * (unlink and raise are async-signal-safe), then ends gshmctl as the
 * signal's default would (SA_RESETHAND gave it back; raised, it ends the
 * process at once, or on return where the handler runs with it blocked):
 * FILE as it was. */
static void read_interrupted(int sig) {
  if (output_tmp[0])
    unlink(output_tmp);
  raise(sig);
}

/* Blocks output_signals, so that output_tmp and the handlers change
 * together; *old_out gets the mask before, which SIG_SETMASK restores. */
static void output_signals_block(sigset_t *old_out) {
  sigset_t set;

  sigemptyset(&set);
  for (size_t i = 0; i < 3; i++)
    sigaddset(&set, output_signals[i]);
  sigprocmask(SIG_BLOCK, &set, old_out);
}

/* output_create's FILE written in place, where lstat found st (exists:
 * it found something).  A regular file is opened only if it is still
 * that file and truncated only then: between the lstat and the open,
 * another user of a group-writable directory without the sticky bit may
 * have put a symbolic link there (which open would follow, truncating
 * whatever it names) or another file; then -ESTALE, nothing touched
 * (O_NONBLOCK: a FIFO put there does not block the open).  Anything else
 * is opened as it is: a symbolic link followed, a device.  Returns the fd
 * or -errno. */
static int output_in_place(const char *file, bool exists, const struct stat *st) {
  struct stat now;
  int fd, e;

  if (!exists || !S_ISREG(st->st_mode))
    return (fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ? -errno : fd;
  if ((fd = open(file, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
    return errno == ELOOP || errno == ENOENT || errno == ENXIO ? -ESTALE : -errno;
  if (fstat(fd, &now) < 0)
    e = -errno;
  else if (!S_ISREG(now.st_mode) || now.st_dev != st->st_dev || now.st_ino != st->st_ino)
    e = -ESTALE;
  else if (fcntl(fd, F_SETFL, 0) < 0 || ftruncate(fd, 0) < 0)
    e = -errno;
  else
    return fd;
  close(fd);
  return e;
}

/* output_open's file: fd for file, or its temporary file, whose path tmp
 * (cap bytes) gets ("" in place).  Only a regular file of this user's own
 * (or none yet) is written as a temporary file; another user's is written
 * in place: renamed, it became this user's with that user's mode,
 * set-user-ID bit included (root reading into a file another user left in
 * /tmp made a set-user-ID root program of bytes that user may have put in
 * the segment); for the same reason the set-group-ID bit is kept only
 * where the new file has the old one's group.  In place, a regular file
 * replaced since its lstat is refused (output_in_place: -ESTALE).
 * Returns the fd or -errno. */
static int output_create(const char *file, char *tmp, size_t cap) {
  const char *slash = strrchr(file, '/');
  struct stat st, mine;
  bool exists = lstat(file, &st) == 0;
  mode_t mask = umask(0), mode = 0644 & ~mask;
  int fd;

  umask(mask);
  tmp[0] = '\0';
  if ((exists && (!S_ISREG(st.st_mode) || st.st_nlink > 1 || st.st_uid != geteuid())) ||
      (!exists && errno != ENOENT))
    return output_in_place(file, exists, &st);
  if (snprintf(tmp, cap, "%.*s.%s.gshmctl-XXXXXX", slash ? (int)(slash - file + 1) : 0, file,
               slash ? slash + 1 : file) >= (int)cap || (fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
    tmp[0] = '\0'; /* (a directory it may not write: in place) */
    return output_in_place(file, exists, &st);
  }
  if (exists)
    mode = fstat(fd, &mine) == 0 && mine.st_gid == st.st_gid ? st.st_mode & 07777
                                                              : st.st_mode & 07777 & ~S_ISGID;
  if (fchmod(fd, mode) < 0) {
    int e = -errno;
    close(fd);
    unlink(tmp);
    return e;
  }
  return fd;
}

/* read -o FILE: where the bytes go until every one is in.  A regular file
 * (or none yet) is written as a temporary file beside it, renamed over it
 * at the end (output_end), so that a read that fails midway (a full disk,
 * a segment revoked) or is ended by SIGINT, SIGTERM or SIGHUP
 * (read_interrupted) leaves FILE as it was instead of cut, and no
 * temporary file; a device, a pipe, a symbolic link, a file of several
 * links, another user's file (output_create) or one in a directory this
 * user may not write is written in place.  Returns the fd or -errno. */
static int output_open(const char *file) {
  struct sigaction sa = {.sa_handler = read_interrupted, .sa_flags = SA_RESETHAND};
  sigset_t mask;
  int fd;

  sigemptyset(&sa.sa_mask);
  output_signals_block(&mask);
  fd = output_create(file, output_tmp, sizeof(output_tmp));
  /* (a signal ignored, as nohup's SIGHUP or a script's background
   * job's SIGINT, stays ignored) */
  for (size_t i = 0; i < 3 && output_tmp[0]; i++)
    if (!sigaction(output_signals[i], NULL, &output_old[i]) &&
        output_old[i].sa_handler != SIG_IGN)
      sigaction(output_signals[i], &sa, NULL);
  sigprocmask(SIG_SETMASK, &mask, NULL);
  return fd;
}

/* Closes read's output fd (of file, written at output_tmp: output_open)
 * and, when ok, renames the temporary file over file; else removes it;
 * the signals' handlers as they were.  Returns 0 or the exit status of
 * the error (printed). */
static int output_end(const char *file, int fd, bool ok) {
  const char *tmp = output_tmp;
  sigset_t mask;
  int rc = EXIT_OK;

  output_signals_block(&mask);
  if (fd >= 0 && close(fd) < 0 && ok)
    rc = errorf(EXIT_ERR, -errno, "read: %s: %s", file, strerror(errno));
  if (*tmp && (rc || !ok || rename(tmp, file) < 0)) {
    if (!rc && ok)
      rc = errorf(EXIT_ERR, -errno, "read: %s: %s", file, strerror(errno));
    unlink(tmp);
  }
  for (size_t i = 0; i < 3 && *tmp; i++)
    sigaction(output_signals[i], &output_old[i], NULL);
  output_tmp[0] = '\0';
  sigprocmask(SIG_SETMASK, &mask, NULL);
  return rc;
}

static int cmd_read(gshm_client_t *c, int argc, char **argv) {
  uint64_t offset = 0, length = 0, done = 0;
  bool have_length = false;
  const char *file = NULL;
  gshm_segment_t *seg = NULL;
  void *addr, *buf = NULL;
  int out = STDOUT_FILENO, e, rc = EXIT_OK;

  if ((rc = rw_opts(argc, argv, false, &offset, &length, &have_length, &file)) ||
      (rc = read_output(&file)))
    return rc;
  if (!c)
    return EXIT_OK;
  if ((e = gshm_open(c, argv[optind], GSHM_ACCESS_READ, &seg)))
    return fail(c, "read", e);
  {
    /* By default the bytes that were asked for at create, not the
     * granularity's padding: a segment holding a file reads back as that
     * file (e.g. safetensors, which must end where its data ends). */
    uint64_t size = gshm_segment_info(seg)->size;
    uint64_t end = have_length ? size : gshm_segment_info(seg)->requested_size;
    if (offset > end || (have_length && length > size - offset)) {
      gshm_close(seg);
      if (offset > end)
        return errorf(EXIT_ERR, -ERANGE, "read: " PAST_END_FMT, offset, end);
      return errorf(EXIT_ERR, -ERANGE,
                    "read: --length %" PRIu64 " from offset %" PRIu64
                    " runs past the segment's end (%" PRIu64 " bytes)",
                    length, offset, size);
    }
    if (!have_length)
      length = end - offset;
  }
  /* One mapping for the whole read: chunks then copy from it. */
  if ((e = gshm_map(seg, NULL, 0, &addr))) {
    rc = fail(c, "read: map", e);
    goto out;
  }
  if (file && (out = output_open(file)) < 0) {
    rc = out == -ESTALE ? errorf(EXIT_ERR, out,
                                 "read: %s: replaced while gshmctl opened it (by a symbolic "
                                 "link or another file): not written; check who else writes "
                                 "its directory",
                                 file)
                        : errorf(EXIT_ERR, out, "read: %s: %s", file, strerror(-out));
    goto out;
  }
  if (!(buf = malloc(CHUNK))) {
    rc = fail(c, "read", -ENOMEM);
    goto out;
  }
  while (done < length) {
    size_t n = length - done < CHUNK ? (size_t)(length - done) : CHUNK;
    if ((e = gshm_read(seg, offset + done, buf, n))) {
      rc = fail(c, "read", e);
      goto out;
    }
    if ((e = write_all(out, buf, n))) {
      rc = errorf(EXIT_ERR, e, "read: writing output: %s", strerror(-e));
      goto out;
    }
    done += n;
  }
out:
  free(buf);
  if (file && (e = output_end(file, out, rc == EXIT_OK)))
    rc = e;
  gshm_close(seg);
  if (rc == EXIT_OK && json_out) {
    json_t *doc = json_transfer(argv[optind], offset, done);
    json_object_set_new(doc, "file", json_text(file));
    rc = print_json(doc);
  } else if (rc == EXIT_OK && file) /* (stdout is free: the one line the other verbs print) */
    say("read %" PRIu64 " bytes of '%s' at offset %" PRIu64 " to %s", done, argv[optind], offset,
        file);
  return rc;
}

/* A temporary file for write's input, unlinked from the start: in
 * $TMPDIR, else /tmp.  Returns its fd (the caller closes it) or -errno;
 * *dir_out names the directory, for messages. */
static int spool_open(const char **dir_out) {
  const char *dir = getenv("TMPDIR");
  char path[4096];
  int fd;

  if (!dir || !*dir)
    dir = "/tmp";
  *dir_out = dir;
  if ((fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) >= 0)
    return fd;
  /* (a file system without O_TMPFILE: a named file, unlinked at once) */
  if (snprintf(path, sizeof(path), "%s/gshmctl-write.XXXXXX", dir) >= (int)sizeof(path))
    return -ENAMETOOLONG;
  if ((fd = mkostemp(path, O_CLOEXEC)) < 0)
    return -errno;
  unlink(path);
  return fd;
}

/* How many bytes write's input holds, known before a byte of it goes into
 * the segment, so that an input that does not fit changes nothing: a
 * regular file's size past its offset (*from_out = in); any other input
 * (a pipe, a terminal, a device) is read to its end, or to room + 1 bytes,
 * into a temporary file (*from_out, positioned at its start; the caller
 * closes it when it is not in).  buf holds CHUNK bytes.  Returns 0, or an
 * exit status whose error was printed; *len_out is then what was read (more
 * than room: the input does not fit). */
static int input_measure(int in, uint64_t room, void *buf, int *from_out, uint64_t *len_out) {
  const char *dir;
  struct stat st;
  uint64_t len = 0;
  off_t at;
  int spool, e;

  *from_out = in;
  if (!fstat(in, &st) && S_ISREG(st.st_mode) && (at = lseek(in, 0, SEEK_CUR)) >= 0) {
    *len_out = (uint64_t)st.st_size > (uint64_t)at ? (uint64_t)(st.st_size - at) : 0;
    return EXIT_OK;
  }
  if ((spool = spool_open(&dir)) < 0)
    return errorf(EXIT_ERR, spool, "write: a temporary file in %s for the input: %s; nothing "
                  "was written (-i FILE goes straight in)", dir, strerror(-spool));
  while (len <= room) {
    ssize_t n = read(in, buf, CHUNK);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      e = errno;
      close(spool);
      return errorf(EXIT_ERR, -e, "write: reading input: %s; nothing was written", strerror(e));
    }
    if (n == 0)
      break;
    if ((e = write_all(spool, buf, (size_t)n))) {
      close(spool);
      return errorf(EXIT_ERR, e, "write: holding the input in %s: %s; nothing was written "
                    "(-i FILE goes straight in)", dir, strerror(-e));
    }
    len += (uint64_t)n;
  }
  if (lseek(spool, 0, SEEK_SET) < 0) {
    e = errno;
    close(spool);
    return errorf(EXIT_ERR, -e, "write: holding the input in %s: %s; nothing was written", dir,
                  strerror(e));
  }
  *from_out = spool;
  *len_out = len;
  return EXIT_OK;
}

/* write: the input, measured first (input_measure), goes into the segment
 * in CHUNK pieces; one that does not fit is refused with nothing written. */
static int cmd_write(gshm_client_t *c, int argc, char **argv) {
  uint64_t offset = 0, unused = 0, done = 0, size, len = 0;
  bool have_length = false;
  const char *file = NULL;
  gshm_segment_t *seg = NULL;
  void *addr, *buf = NULL;
  int in = STDIN_FILENO, from = -1, e, rc;

  if ((rc = rw_opts(argc, argv, true, &offset, &unused, &have_length, &file)))
    return rc;
  if (!c)
    return EXIT_OK;
  if (file && (in = open(file, O_RDONLY | O_CLOEXEC)) < 0) {
    return errorf(EXIT_ERR, -errno, "write: %s: %s", file, strerror(errno));
  }
  if ((e = gshm_open(c, argv[optind], GSHM_ACCESS_READ_WRITE, &seg))) {
    rc = fail(c, "write", e);
    goto out;
  }
  size = gshm_segment_info(seg)->size;
  if (offset > size) {
    rc = errorf(EXIT_ERR, -ERANGE, "write: " PAST_END_FMT, offset, size);
    goto out;
  }
  if ((e = gshm_map(seg, NULL, 0, &addr))) {
    rc = fail(c, "write: map", e);
    goto out;
  }
  if (!(buf = malloc(CHUNK))) {
    rc = fail(c, "write", -ENOMEM);
    goto out;
  }
  if ((rc = input_measure(in, size - offset, buf, &from, &len)))
    goto out;
  if (len > size - offset) {
    /* both numbers: how much input there is (at least), and the room */
    rc = errorf(EXIT_ERR, -EFBIG,
                "write: the input (%s%" PRIu64 " bytes) does not fit: the segment has %" PRIu64
                " bytes, %" PRIu64 " of them from offset %" PRIu64 " on; nothing was written",
                from == in ? "" : "at least ", len, size, size - offset, offset);
    goto out;
  }
  while (done < len) {
    ssize_t n = read(from, buf, len - done < CHUNK ? (size_t)(len - done) : CHUNK);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      rc = errorf(EXIT_ERR, -errno, "write: reading input: %s", strerror(errno));
      break;
    }
    if (n == 0) /* (a file that shrank meanwhile) */
      break;
    if ((e = gshm_write(seg, offset + done, buf, (size_t)n))) {
      rc = fail(c, "write", e);
      break;
    }
    done += (uint64_t)n;
  }
  if (rc == EXIT_OK && json_out) {
    rc = print_json(json_transfer(argv[optind], offset, done));
  } else if (rc == EXIT_OK) {
    say("wrote %" PRIu64 " bytes to '%s' at offset %" PRIu64, done, argv[optind], offset);
  }
out:
  free(buf);
  if (from >= 0 && from != in)
    close(from);
  if (file)
    close(in);
  gshm_close(seg);
  return rc;
}

/* ---- cluster verbs ---- */

/* The pulls in flight, as `peers` shows them (JSON: an array): NAME the
 * peer's segment or prefix, LOCAL where it lands here (--as); v has the
 * n listed of the in_flight there are. */
static json_t *pulls_in_flight(const gshm_cluster_pull_t *v, size_t n, uint64_t in_flight) {
  static char esc[SHOWN_CAP], esc2[SHOWN_CAP], esc3[SHOWN_CAP];
  char done[32], total[32], segs[48];
  json_t *arr = json_out ? json_array() : NULL;
  int wp = 16, wn = 24, wl = 24;

  for (size_t i = 0; i < n; i++) {
    wp = widen(wp, v[i].peer);
    wn = widen(wn, v[i].name);
    wl = widen(wl, v[i].local_name);
  }
  if (in_flight > n && !json_out)
    printf("\n%" PRIu64 " pulls in flight, the first %zu listed:\n", in_flight, n);
  else if (n && !json_out)
    printf("\n%zu pull%s in flight:\n", n, gshm__plural(n));
  if (n && !json_out)
    printf("%-*s %-*s %-*s %6s %-20s %-23s %s\n", wp, "PEER", wn, "NAME", wl, "LOCAL", "UID",
           "BYTES", "SEGMENTS", "TIME");
  for (size_t i = 0; i < n; i++) {
    double sec = (double)v[i].elapsed_ns / 1e9;
    if (json_out) {
      json_t *o = json_object();
      json_object_set_new(o, "peer", json_text(v[i].peer));
      json_object_set_new(o, "name", json_text(v[i].name));
      json_object_set_new(o, "local_name", json_text(v[i].local_name));
      json_object_set_new(o, "prefix", json_boolean(v[i].prefix));
      json_object_set_new(o, "uid", json_integer(v[i].uid));
      json_object_set_new(o, "bytes_done", json_integer((json_int_t)v[i].bytes_done));
      json_object_set_new(o, "bytes_total", json_integer((json_int_t)v[i].bytes_total));
      json_object_set_new(o, "segments_done", json_integer(v[i].segments_done));
      json_object_set_new(o, "segments_total", json_integer(v[i].segments_total));
      json_object_set_new(o, "seconds", json_real(sec));
      json_object_set_new(o, "ending", v[i].ending[0] ? json_text(v[i].ending) : json_null());
      json_array_append_new(arr, o);
      continue;
    }
    shown(v[i].peer, esc);
    shown(v[i].name, esc2);
    shown(v[i].local_name, esc3);
    /* (SEGMENTS one field wide, so that TIME has a column of its own) */
    snprintf(segs, sizeof(segs), "%u/%u%s", v[i].segments_done, v[i].segments_total,
             v[i].prefix && !v[i].segments_total ? " (listing)" : "");
    printf("%-*s %-*s %-*s %6u %9s/%-9s  %-23s %.1f s", col(esc, wp), esc, col(esc2, wn), esc2,
           col(esc3, wl), esc3, v[i].uid, gshm__format_size(v[i].bytes_done, done, sizeof(done)),
           gshm__format_size(v[i].bytes_total, total, sizeof(total)), segs, sec);
    /* (a failed or cancelled one that waits for its peers' answers) */
    if (v[i].ending[0])
      printf("  ending: %s", shown(v[i].ending, esc));
    printf("\n");
  }
  return arr;
}

/* Whether peer p's export count is current: gshmd asks an up peer for
 * it; a peer down or connecting has only the count last seen. */
static bool peer_up(const gshm_cluster_peer_t *p) { return !strcmp(p->state, "up"); }

/* An up peer's protocol as "MAJOR.MINOR" in buf (24 bytes); false when
 * unknown (not up, or a gshmd or libgshm before it). */
static bool peer_protocol(const gshm_cluster_peer_t *p, char *buf) {
  if (!p->protocol_major)
    return false;
  snprintf(buf, 24, "%u.%u", p->protocol_major, p->protocol_minor);
  return true;
}

static int cmd_peers(gshm_client_t *c) {
  static char esc[SHOWN_CAP], esc2[SHOWN_CAP], esc3[SHOWN_CAP];
  gshm_cluster_peer_t *v = NULL;
  gshm_cluster_pull_t *pv = NULL;
  char node[64] = "", proto[24];
  size_t n = 0, np = 0;
  uint64_t ntotal = 0;
  int e = gshm_cluster_peers(c, node, &v, &n);

  if (!e && (e = gshm_cluster_pulls_counted(c, &pv, &np, &ntotal)))
    gshm_free(v);
  if (e)
    return fail(c, "peers", e);
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    json_object_set_new(doc, "node_name", json_text(node));
    /* (what the text says as "cluster off", for scripts) */
    json_object_set_new(doc, "cluster", json_boolean(node[0] != '\0'));
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object();
      json_object_set_new(o, "name", json_text(v[i].name));
      json_object_set_new(o, "address", json_text(v[i].address));
      json_object_set_new(o, "state", json_string(v[i].state));
      /* a count is current for an up peer only: else it is unknown
       * (null), and the count last seen has a name that says so */
      json_object_set_new(o, "exported", peer_up(&v[i]) ? json_integer(v[i].exported)
                                                         : json_null());
      json_object_set_new(o, "exported_last_seen", json_integer(v[i].exported));
      json_object_set_new(o, "message", json_text(v[i].message));
      /* (null: not up, or a gshmd before it says nothing) */
      json_object_set_new(o, "protocol", peer_protocol(&v[i], proto) ? json_string(proto)
                                                                      : json_null());
      json_object_set_new(o, "subkeys", v[i].protocol_major ? json_boolean(v[i].subkeys)
                                                            : json_null());
      json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "peers", arr);
    json_object_set_new(doc, "pulls", pulls_in_flight(pv, np, ntotal));
    /* (pulls lists the first 64 at most) */
    json_object_set_new(doc, "pulls_in_flight", json_integer((json_int_t)ntotal));
    gshm_free(v);
    gshm_free(pv);
    return print_json(doc);
  }
  if (!node[0])
    printf("cluster off (gshmd's cluster.listen and cluster.peers are empty)\n");
  else
    say("node '%s', %zu peer%s", node, n, n == 1 ? "" : "s");
  int wn = 16, wa = 24;
  for (size_t i = 0; i < n; i++) {
    wn = widen(wn, v[i].name);
    wa = widen(wa, v[i].address);
  }
  if (n)
    printf("%-*s %-*s %-10s %-5s %-7s %8s %s\n", wn, "PEER", wa, "ADDRESS", "STATE", "PROTO",
           "SUBKEYS", "EXPORTED", "MESSAGE");
  /* a message may quote what a peer sent in its hello, before it proved
   * the key ("calls itself 'NAME'"): escaped as every name is */
  for (size_t i = 0; i < n; i++) {
    shown(v[i].name, esc);
    shown(v[i].address, esc2);
    char count[16] = "-";
    if (peer_up(&v[i]))
      snprintf(count, sizeof(count), "%u", v[i].exported);
    bool known = peer_protocol(&v[i], proto);
    printf("%-*s %-*s %-10s %-5s %-7s %8s %s\n", col(esc, wn), esc, col(esc2, wa), esc2,
           v[i].state, known ? proto : "-", !known ? "-" : v[i].subkeys ? "yes" : "no", count,
           shown(v[i].message, esc3));
  }
  pulls_in_flight(pv, np, ntotal);
  gshm_free(v);
  gshm_free(pv);
  return EXIT_OK;
}

static int cmd_remote_segments(gshm_client_t *c, const char *peer) {
  static char esc[SHOWN_CAP], esc2[SHOWN_CAP];
  gshm_segment_info_t *v = NULL;
  size_t n = 0;
  char t[40], sz[32];
  int e;

  if (strchr(peer, ',')) /* (gshmd looked for a peer named so: "no such peer") */
    return errorf(EXIT_USAGE, -EINVAL, "segments --peer '%s': one peer at a time (a list "
                  "PEER1,PEER2 is for pull --prefix)", peer);
  if (!c)
    return EXIT_OK;
  if ((e = gshm_list_remote(c, peer, &v, &n))) {
    char what[96];
    snprintf(what, sizeof(what), "segments --peer %.64s", peer);
    return fail_peer(c, what, e, peer, exit_code(e));
  }
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    json_object_set_new(doc, "peer", json_text(peer));
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object();
      json_segment_identity(o, &v[i]);
      json_object_set_new(o, "created", json_string(rfc3339(v[i].created_ns, t, sizeof(t))));
      json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "segments", arr);
    gshm_free(v);
    return print_json(doc);
  }
  int wn = 32, wl = 10;
  for (size_t i = 0; i < n; i++) {
    wn = widen(wn, v[i].name);
    wl = widen(wl, v[i].location);
  }
  printf("%-6s %-*s %10s %-*s %s\n", "ID", wn, "NAME", "SIZE", wl, "LOCATION", "AGE");
  for (size_t i = 0; i < n; i++) {
    shown(v[i].name, esc);
    shown(v[i].location, esc2);
    printf("%-6" PRIu64 " %-*s %10s %-*s %s\n", v[i].id, col(esc, wn), esc,
           size_cell(&v[i], sz, sizeof(sz)), col(esc2, wl), esc2,
           age(v[i].created_ns, t, sizeof(t)));
  }
  gshm_free(v);
  return EXIT_OK;
}

/* A progress bar on stderr for the whole pull: bytes (both in the total's
 * unit and precision), rate, time left and, for a set, segments done. */
static void pull_progress_bar(const gshm_pull_progress_t *p, void *arg) {
  char segs[48] = "";
  char done[32], total[32];
  double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
  double sec = (double)p->elapsed_ns / 1e9;
  double rate = sec > 0 ? (double)p->bytes_done / sec : 0;
  double left = rate > 0 ? (double)(p->bytes_total - p->bytes_done) / rate : 0;
  char bar[31];
  int fill = (int)(frac * 30);

  if (*(const bool *)arg && p->segments_total)
    snprintf(segs, sizeof(segs), "  %u/%u segment%s", p->segments_done, p->segments_total,
             gshm__plural(p->segments_total));
  else if (*(const bool *)arg)
    snprintf(segs, sizeof(segs), "  %u segment%s (listing)", p->segments_done,
             gshm__plural(p->segments_done));
  for (int i = 0; i < 30; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[30] = '\0';
  fprintf(stderr, "\r[%s] %3d%% %s / %s  %.2f GB/s  %d:%02d left%s ", bar, (int)(frac * 100),
          gshm__format_size_as(p->bytes_done, p->bytes_total, done, sizeof(done)),
          gshm__format_size_as(p->bytes_total, p->bytes_total, total, sizeof(total)), rate / 1e9,
          (int)left / 60, (int)left % 60, segs);
}

/* One pulled segment, as --json shows it: the peer it was read from, its
 * name and ids there (null when the peer relayed it: it had none yet),
 * its source (where it came from first), and the local segment's
 * granularity and creation time (null when gshmd sent none: 0). */
static json_t *pulled_json(const gshm_pull_result_t *r) {
  json_t *o = json_object();
  char t[40];
  json_object_set_new(o, "peer", json_text(r->peer));
  json_object_set_new(o, "remote_name", json_text(r->remote_name));
  json_object_set_new(o, "remote_id",
                      r->relayed ? json_null() : json_integer((json_int_t)r->remote_id));
  json_object_set_new(o, "remote_generation",
                      r->relayed ? json_null() : json_integer((json_int_t)r->remote_generation));
  json_object_set_new(o, "relayed", json_boolean(r->relayed));
  json_object_set_new(o, "name", json_text(r->segment.name));
  json_object_set_new(o, "id", json_integer((json_int_t)r->segment.id));
  json_object_set_new(o, "location", json_string(r->segment.location));
  json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
  json_object_set_new(o, "path", json_string(r->path));
  json_object_set_new(o, "path_reason", json_text(r->path_reason));
  json_object_set_new(o, "source", json_text(r->segment.source));
  json_object_set_new(o, "granularity", r->segment.granularity
                                            ? json_integer((json_int_t)r->segment.granularity)
                                            : json_null());
  json_object_set_new(o, "created", r->segment.created_ns
                                        ? json_string(rfc3339(r->segment.created_ns, t, sizeof(t)))
                                        : json_null());
  return o;
}

/* bytes of PEER in PEER:NAME, its NUL included: a peer's name (63), or
 * for a set up to 8 of them separated by commas */
#define PULL_PEER_CAP 512

/* "  from PEER: N segments, SIZE" for each peer of v[n], in the order
 * each first appears. */
static void pulled_by_peer(const gshm_pull_result_t *v, size_t n) {
  char sz[32];

  for (size_t i = 0; i < n; i++) {
    size_t k = 0, count = 0;
    uint64_t bytes = 0;
    while (k < i && strcmp(v[k].peer, v[i].peer))
      k++;
    if (k < i)
      continue; /* (counted at its first) */
    for (k = i; k < n; k++)
      if (!strcmp(v[k].peer, v[i].peer)) {
        count++;
        bytes += v[k].bytes;
      }
    say("  from %s: %zu segment%s, %s", v[i].peer, count, count == 1 ? "" : "s",
        gshm__format_size(bytes, sz, sizeof(sz)));
  }
}

/* A set pull's set in words, into buf (cap bytes): "under PEER:PREFIX",
 * or for the empty prefix (every segment the peers export) "from PEER
 * (all it exports)": "under PEER:" made "pulled 2 segments under
 * node7:: 3 MiB". */
#define SET_NAMED_CAP (PULL_PEER_CAP + GSHM_NAME_MAX + 32)
static const char *set_named(char *buf, size_t cap, const char *peer, const char *prefix) {
  if (*prefix)
    snprintf(buf, cap, "under %s:%s", peer, prefix);
  else
    snprintf(buf, cap, "from %s (all %s)", peer,
             strchr(peer, ',') ? "they export" : "it exports");
  return buf;
}

/* The summary of a set pull (--prefix); as: the local prefix (--as), or
 * NULL. */
static int pulled_set(const char *peer, const char *prefix, const char *as,
                      const gshm_pull_result_t *v, size_t n) {
  uint64_t bytes = 0;
  double sec = n ? (double)v[0].elapsed_ns / 1e9 : 0;
  unsigned paths[3] = {0}, relayed = 0;
  char sz[32], rel[160] = "", where[300] = "", set[SET_NAMED_CAP];

  for (size_t i = 0; i < n; i++) {
    bytes += v[i].bytes;
    paths[!strcmp(v[i].path, "staged") ? 1 : !strcmp(v[i].path, "direct") ? 2 : 0]++;
    relayed += v[i].relayed != 0;
  }
  if (json_out) {
    json_t *doc = json_doc(), *arr = json_array();
    json_object_set_new(doc, "peer", json_text(peer));
    json_object_set_new(doc, "prefix", json_text(prefix));
    json_object_set_new(doc, "count", json_integer((json_int_t)n));
    json_object_set_new(doc, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(doc, "seconds", json_real(sec));
    json_object_set_new(doc, "gb_per_s", json_real(sec > 0 ? (double)bytes / sec / 1e9 : 0));
    json_object_set_new(doc, "paths", json_pack("{s:I,s:I,s:I}", "host", (json_int_t)paths[0],
                                                "staged", (json_int_t)paths[1], "direct",
                                                (json_int_t)paths[2]));
    json_object_set_new(doc, "relayed_count", json_integer(relayed));
    json_object_set_new(doc, "path_reason", json_text(n ? v[0].path_reason : ""));
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, pulled_json(&v[i]));
    json_object_set_new(doc, "segments", arr);
    return print_json(doc);
  }
  if (relayed)
    snprintf(rel, sizeof(rel), "; %u relayed: %.64s was still pulling them", relayed,
             strchr(peer, ',') ? "their source" : peer);
  if (as && *as && strcmp(as, prefix)) /* (where the names are, --as another prefix) */
    snprintf(where, sizeof(where), " as '%s'", as);
  say("pulled %zu segment%s %s%s: %s in %.3f s, %.2f GB/s (paths: %u host, %u staged, "
      "%u direct%s)",
      n, n == 1 ? "" : "s", set_named(set, sizeof(set), peer, prefix), where,
      gshm__format_size(bytes, sz, sizeof(sz)), sec,
      sec > 0 ? (double)bytes / sec / 1e9 : 0, paths[0], paths[1], paths[2], rel);
  if (strchr(peer, ',')) /* several sources: what each gave */
    pulled_by_peer(v, n);
  return EXIT_OK;
}

/* The first of name's glob characters (fnmatch's '*', '?', '['), or NULL. */
static char *glob_char(const char *name) {
  const char *g = name + strcspn(name, "*?[");
  return *g ? (char *)g : NULL;
}

/* pull --prefix takes the start of the names, not a pattern; a user who has
 * read cluster.export's rules types 'llama/' and a '*': one '*' that ends name (the
 * NAME of PEER:NAME, or --as's local prefix) means the prefix before it and
 * is dropped, in place; any other glob character in name is refused,
 * naming the prefix to write instead (the start of name before it).  peer:
 * PEER as typed, len bytes of it; as: name is --as's.  Returns 0 or
 * EXIT_USAGE (printed). */
static int pull_prefix_glob(const char *peer, int len, char *name, bool as) {
  size_t n = strlen(name);
  bool star = n && name[n - 1] == '*';
  const char *g;

  if (as && star && n == 1) /* (an empty --as is refused as such: pull_args) */
    return errorf(EXIT_USAGE, -EINVAL, "pull: --as needs a local prefix, not '*' (without "
                  "--as: the peer's names)");
  if (star)
    name[n - 1] = '\0';
  if (!(g = glob_char(name)))
    return 0;
  if (star) /* (as typed, for the message) */
    name[n - 1] = '*';
  if (as)
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: --as '%s' is a pattern: with --prefix, --as is the local prefix itself, "
                  "'*' only at its end (write --as '%.*s')", name, (int)(g - name), name);
  return errorf(EXIT_USAGE, -EINVAL,
                "pull: '%s' is a pattern: --prefix takes the start of the names, '*' only at "
                "its end ('llama/*' is 'llama/'); write gshmctl pull '%.*s:%.*s' --prefix for "
                "%s%.*s%s", name, len, peer, (int)(g - name), name,
                g == name ? "all it exports" : "every segment whose name starts with '",
                (int)(g - name), name, g == name ? "" : "'");
}

/* For a one-segment pull refused -ENOENT (err) of a name with a glob
 * character ('*' is a name's character as any other, so the pull was
 * tried): the set pull its typist may have meant, in buf (cap bytes), or
 * "".  peer: PEER as typed. */
static const char *glob_hint(int err, const char *peer, const char *name, char *buf,
                             size_t cap) {
  const char *g = glob_char(name);

  buf[0] = '\0';
  if (err == -ENOENT && g)
    snprintf(buf, cap, " (a pattern? did you mean --prefix: gshmctl pull '%s:%.*s' --prefix, "
             "%s%.*s%s)", peer, (int)(g - name), name,
             g == name ? "all it exports" : "every segment whose name starts with '",
             (int)(g - name), name, g == name ? "" : "'");
  return buf;
}

/* pull's PEER:NAME (argv[optind], the one argument left after the options)
 * and its --as (as, NULL without), checked against each other and
 * --prefix: *colon_out at the ':' of PEER:NAME.  With --prefix, a '*' that
 * ends NAME or as is dropped (pull_prefix_glob).  Returns 0 or the exit
 * status of a usage error (printed). */
static int pull_target(int argc, char **argv, bool prefix, char *as, const char **colon_out) {
  const char *colon;

  if (argc - optind == 1 && (!(colon = strchr(argv[optind], ':')) || colon == argv[optind]))
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: '%s' names no peer: write PEER:NAME (gshmctl peers lists the peers)",
                  argv[optind]);
  if (argc - optind == 1 && !colon[1] && !prefix)
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: '%s' names no segment: write PEER:NAME (gshmctl segments --peer "
                  "%.*s lists them), or add --prefix to pull every segment it exports",
                  argv[optind], (int)strcspn(argv[optind], ",:"), argv[optind]);
  if (argc - optind != 1 || !(colon = strchr(argv[optind], ':')) || colon == argv[optind] ||
      (!colon[1] && !prefix) || (size_t)(colon - argv[optind]) >= PULL_PEER_CAP) {
    return errorf(EXIT_USAGE, -EINVAL,
                  "usage: pull PEER:NAME [--as LOCAL] [--prefix] [--replace] [--location LOC] "
                  "[--mode MODE]");
  }
  if (prefix && (pull_prefix_glob(argv[optind], (int)(colon - argv[optind]),
                                  argv[optind] + (colon - argv[optind]) + 1, false) ||
                 (as && pull_prefix_glob(NULL, 0, as, true))))
    return EXIT_USAGE;
  if (!prefix && colon[strlen(colon) - 1] == '/')
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: '%s' ends in '/': to pull every segment under it, add --prefix",
                  colon + 1);
  if (!prefix && as && as[strlen(as) - 1] == '/')
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: --as '%s' ends in '/', and a name cannot: for one segment --as is its "
                  "local name (write --as '%s%s'); with --prefix, the local prefix",
                  as, as,
                  strrchr(colon + 1, '/') ? strrchr(colon + 1, '/') + 1 : colon + 1);
  /* The local prefix replaces the peer's verbatim: "--as v2" for
   * "llama/" would make "v2seg-000001", not "v2/seg-000001". */
  if (prefix && colon[1] && colon[strlen(colon) - 1] == '/' && as &&
      *as && as[strlen(as) - 1] != '/')
    return errorf(EXIT_USAGE, -EINVAL,
                  "pull: --as '%s' does not end in '/' as '%s' does: each local name would "
                  "be '%s' and the rest of the peer's name, with no '/' between; write "
                  "--as '%s/'", as, colon + 1, as, as);
  *colon_out = colon;
  return 0;
}

/* pull's options and PEER:NAME (argv[optind]), checked: po filled in,
 * *prefix_out for --prefix, *colon_out at the ':' of PEER:NAME.  Returns 0
 * or the exit status of a usage error (printed). */
static int pull_args(int argc, char **argv, gshm_pull_opts_t *po, bool *prefix_out,
                     const char **colon_out) {
  static const struct option opts[] = {{"as", required_argument, NULL, 'a'},
                                       {"location", required_argument, NULL, 'l'},
                                       {"mode", required_argument, NULL, 'm'},
                                       {"prefix", no_argument, NULL, 'p'},
                                       {"replace", no_argument, NULL, 'r'},
                                       {NULL, 0, NULL, 0}};
  char *as = NULL;
  bool prefix = false;
  int o;

  optind = 0;
  while ((o = getopt_long(argc, argv, ":a:l:m:pr", opts, NULL)) != -1) {
    switch (o) {
    case 'a':
      if (!*optarg) /* (gshm_pull's default: the peer's own name, maybe --replace'd) */
        return errorf(EXIT_USAGE, -EINVAL, "pull: --as needs a local name, not '' (without "
                      "--as: the peer's name)");
      po->local_name = as = optarg;
      break;
    case 'l':
      if (check_location("pull", optarg))
        return EXIT_USAGE;
      po->location = optarg;
      break;
    case 'm':
      if (parse_mode("pull", optarg, true, &po->mode))
        return EXIT_USAGE;
      break;
    case 'p':
      prefix = true;
      break;
    case 'r':
      po->replace = 1;
      break;
    default:
      return bad_option("pull", o, argv);
    }
  }
  if ((o = pull_target(argc, argv, prefix, as, colon_out)))
    return o;
  *prefix_out = prefix;
  return 0;
}

/* The progress bar at its end, after a pull that succeeded (progress
 * comes at most every 200 ms): one segment r, or the n of a set pull v. */
static void pull_bar_end(bool prefix, const gshm_pull_result_t *r, const gshm_pull_result_t *v,
                         size_t n) {
  gshm_pull_progress_t end = {.elapsed_ns = prefix ? (n ? v[0].elapsed_ns : 0) : r->elapsed_ns,
                              .segments_done = prefix ? (uint32_t)n : 1,
                              .segments_total = prefix ? (uint32_t)n : 1};

  for (size_t i = 0; i < (prefix ? n : 1); i++)
    end.bytes_done += prefix ? v[i].bytes : r->bytes;
  end.bytes_total = end.bytes_done;
  pull_progress_bar(&end, &prefix);
}

/* The result of a one-segment pull of the peer's `name`. */
static int pulled_one(const gshm_pull_result_t *r, const char *name) {
  char sz[32];

  if (json_out) {
    json_t *doc = json_doc(), *one = pulled_json(r);
    json_object_update(doc, one);
    json_decref(one);
    json_object_set_new(doc, "seconds", json_real((double)r->elapsed_ns / 1e9));
    json_object_set_new(doc, "gb_per_s",
                        json_real(r->elapsed_ns ? (double)r->bytes / (double)r->elapsed_ns : 0));
    return print_json(doc);
  }
  say("pulled %s:%s into '%s' (id %" PRIu64 "): %s in %.3f s, %.2f GB/s, path %s (%s)", r->peer,
      name, r->segment.name, r->segment.id, gshm__format_size(r->bytes, sz, sizeof(sz)),
      (double)r->elapsed_ns / 1e9, r->elapsed_ns ? (double)r->bytes / (double)r->elapsed_ns : 0,
      r->path, r->path_reason);
  /* a copy of a copy (or relayed): where it came from first */
  if (r->relayed || strncmp(r->segment.source, r->peer, strlen(r->peer)) ||
      r->segment.source[strlen(r->peer)] != ':')
    say("  %sfirst from %s", r->relayed ? "relayed (the peer was still pulling it), " : "",
        r->segment.source);
  return EXIT_OK;
}

/* The pull's client while a pull runs, and the signal that cancelled it
 * (0: none): pull_interrupted's. */
static gshm_client_t *pulling;
static volatile sig_atomic_t pull_signal;

/* SIGINT or SIGTERM during a pull: asks for its cancel (gshm_pull_cancel
 * only sets a flag, async-signal-safe; the pull ends -ECANCELED within
 * 0.1 s, nothing kept).  SA_RESETHAND gives the signal its default back:
 * a second Ctrl-C ends gshmctl at once (gshmd then cancels the pull when
 * its connection closes). */
static void pull_interrupted(int sig) {
  pull_signal = sig;
  (void)gshm_pull_cancel(pulling);
}

/* Runs the pull with pull_interrupted on SIGINT and SIGTERM, each but
 * one ignored at start (nohup, or a script's background job's SIGINT),
 * which stays ignored: such a pull is not to be cancelled by it.
 * Returns what gshm_pull or gshm_pull_prefix does. */
static int pull_run(gshm_client_t *c, const char *peer, const char *name, bool prefix,
                    const gshm_pull_opts_t *po, gshm_pull_result_t *r, gshm_pull_result_t **v,
                    size_t *n) {
  struct sigaction sa = {.sa_handler = pull_interrupted, .sa_flags = SA_RESETHAND}, old[2];
  const int sigs[2] = {SIGINT, SIGTERM};
  bool set[2] = {false, false};
  int e;

  pulling = c;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < 2; i++)
    set[i] = !sigaction(sigs[i], NULL, &old[i]) && old[i].sa_handler != SIG_IGN &&
             !sigaction(sigs[i], &sa, NULL);
  e = prefix ? gshm_pull_prefix(c, peer, name, po, v, n) : gshm_pull(c, peer, name, po, r);
  for (size_t i = 0; i < 2; i++)
    if (set[i])
      sigaction(sigs[i], &old[i], NULL);
  return e;
}

static int cmd_pull(gshm_client_t *c, int argc, char **argv) {
  gshm_pull_opts_t po = {0};
  gshm_pull_result_t r, *v = NULL;
  char peer[PULL_PEER_CAP];
  const char *colon = NULL;
  size_t n = 0;
  int e, rc;
  bool bar, prefix = false;

  if ((rc = pull_args(argc, argv, &po, &prefix, &colon)))
    return rc;
  if (!c)
    return EXIT_OK;
  snprintf(peer, sizeof(peer), "%.*s", (int)(colon - argv[optind]), argv[optind]);
  bar = !json_out && isatty(STDERR_FILENO);
  if (bar) {
    po.progress = pull_progress_bar;
    po.progress_arg = &prefix;
  }
  e = pull_run(c, peer, colon + 1, prefix, &po, &r, &v, &n);
  if (bar) {
    if (!e)
      pull_bar_end(prefix, &r, v, n);
    fputc('\n', stderr);
  }
  if (e == -ECANCELED && pull_signal) {
    char what[SET_NAMED_CAP];
    if (prefix)
      set_named(what, sizeof(what), peer, colon + 1);
    else
      snprintf(what, sizeof(what), "%s:%s", peer, colon + 1);
    return errorf(128 + pull_signal, e, "pull of %s%s cancelled (%s): nothing was kept",
                  prefix ? "the set " : "", what, pull_signal == SIGINT ? "SIGINT" : "SIGTERM");
  }
  if (e && strcmp(gshm_last_error(c), GSHM_LOST_GSHMD_TEXT)) { /* gshmd's answer: as its log */
    char msg[768], hint[256], glob[2 * GSHM_NAME_MAX + PULL_PEER_CAP + 128];
    gshm__pull_failure_message(msg, sizeof(msg), prefix, colon + 1, peer, e, gshm_last_error(c));
    return errorf(exit_code(e), e, "%s%s%s%s", msg, peer_hint(c, e, peer, hint, sizeof(hint)),
                  replace_hint(e, po.replace, gshm_last_error(c)),
                  prefix ? "" : glob_hint(e, peer, colon + 1, glob, sizeof(glob)));
  }
  if (e)
    return fail(c, "pull", e);
  if (!prefix)
    return pulled_one(&r, colon + 1);
  rc = pulled_set(peer, colon + 1, po.local_name, v, n);
  gshm_free(v);
  return rc;
}

/* Runs verb on c; with c NULL (verbs that take arguments only), checks the
 * arguments and returns EXIT_OK or their usage error without connecting. */
static int dispatch(gshm_client_t *c, const char *verb, int argc, char **argv) {
  int rc;

  if (!strcmp(verb, "status"))
    rc = cmd_status(c);
  else if (!strcmp(verb, "segments"))
    rc = cmd_segments(c, argc, argv);
  else if (!strcmp(verb, "peers"))
    rc = cmd_peers(c);
  else if (!strcmp(verb, "pull"))
    rc = cmd_pull(c, argc, argv);
  else if (!strcmp(verb, "mappings"))
    rc = cmd_mappings(c);
  else if (!strcmp(verb, "clients"))
    rc = cmd_clients(c);
  else if (!strcmp(verb, "devices"))
    rc = cmd_devices(c);
  else if (!strcmp(verb, "metrics"))
    rc = cmd_metrics(c);
  else if (!strcmp(verb, "create"))
    rc = cmd_create(c, argc, argv);
  else if (!strcmp(verb, "unlink"))
    rc = cmd_unlink(c, argc, argv);
  else if (!strcmp(verb, "read"))
    rc = cmd_read(c, argc, argv);
  else if (!strcmp(verb, "chmod"))
    rc = cmd_chmod(c, argc, argv);
  else if (!strcmp(verb, "chown"))
    rc = cmd_chown(c, argc, argv);
  else if (!strcmp(verb, "revoke"))
    rc = cmd_revoke(c, argc, argv);
  else
    rc = cmd_write(c, argc, argv);
  return rc;
}

/* --socket '' (an unset variable in a script): a usage error, not the
 * default socket, whose gshmd the script did not mean to change.
 * Returns EXIT_USAGE. */
static int empty_socket(void) {
  return errorf(EXIT_USAGE, -EINVAL, "option '--socket' needs a path, not '' (without --socket: "
                "$GSHM_SOCKET, else %s)", GSHM_DEFAULT_SOCKET);
}

/* gshmctl's own options before the verb: --socket, --json, and --help
 * and --version, which end the run (the first of them given, printed once
 * the options parsed without a usage error).  Returns -1 to go on (optind
 * at the verb), else the exit status. */
static int global_options(int argc, char **argv) {
  static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {"version", no_argument, NULL, 'V'},
                                       {NULL, 0, NULL, 0}};
  int o, info = 0; /* 'h' or 'V': answered once every option before the verb parsed */

  opterr = 0; /* errorf reports, with the program's name (and as JSON) */
  /* "+": stop at the verb, whose own options follow it. */
  while ((o = getopt_long(argc, argv, "+:s:jhV", opts, NULL)) != -1) {
    switch (o) {
    case 's':
      if (!*optarg)
        return empty_socket();
      socket_path = optarg;
      break;
    case 'j':
      json_out = 1;
      break;
    case 'h':
    case 'V':
      info = info ? info : o;
      break;
    case ':':
      return errorf(EXIT_USAGE, -EINVAL, "option '%s' needs a value", argv[optind - 1]);
    default:
      return errorf(EXIT_USAGE, -EINVAL, "unknown option '%s' (gshmctl --help lists them)",
                    argv[optind - 1]);
    }
  }
  /* (after the loop: "gshmctl -V --bogus" is a usage error, not a version) */
  if (info == 'h')
    usage(stdout);
  else if (info == 'V')
    printf("gshmctl %s\n", GSHM_VERSION);
  return info ? EXIT_OK : -1;
}

/* Global options may also follow the verb ("gshmctl mappings --json"):
 * takes them out of argv[1..*argc_io) (argv[0] the verb) before the verb
 * parses its own; "--help" sets *help_out; after "--" the rest stays as it
 * is.  Returns 0 or the exit status of a usage error. */
static int options_after_verb(int *argc_io, char **argv, bool *help_out) {
  int argc = *argc_io, w = 1;

  for (int r = 1; r < argc; r++) {
    if (!strcmp(argv[r], "--json") || !strcmp(argv[r], "-j")) {
      json_out = 1;
    } else if (!strcmp(argv[r], "--socket") || !strcmp(argv[r], "-s")) {
      if (r + 1 == argc)
        return errorf(EXIT_USAGE, -EINVAL, "option '%s' needs a value", argv[r]);
      socket_path = argv[++r];
      if (!*socket_path)
        return empty_socket();
    } else if (!strncmp(argv[r], "--socket=", 9)) {
      socket_path = argv[r] + 9;
      if (!*socket_path)
        return empty_socket();
    } else if (!strcmp(argv[r], "--help") || !strcmp(argv[r], "-h")) {
      *help_out = true;
    } else if (!strcmp(argv[r], "--")) { /* the rest as it is: a name "--help" */
      args_literal = true;
      while (r < argc)
        argv[w++] = argv[r++];
    } else {
      argv[w++] = argv[r];
    }
  }
  *argc_io = w;
  argv[w] = NULL;
  return 0;
}

static bool verb_known(const char *verb) {
  static const char *const verbs[] = {"status", "segments", "mappings", "clients", "devices",
                                      "metrics", "create", "unlink", "read", "write",
                                      "chmod", "chown", "revoke", "peers", "pull"};
  for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
    if (!strcmp(verb, verbs[i]))
      return true;
  return false;
}

/* The verbs getopt parses take "--" as the end of their options; the
 * others (unlink, chmod, chown, revoke) read NAME without it: their "--"
 * is taken out of argv. */
static void drop_end_of_options(const char *verb, int *argc_io, char **argv) {
  if (args_literal && *argc_io > 1 && !strcmp(argv[1], "--") &&
      (!strcmp(verb, "unlink") || !strcmp(verb, "chmod") || !strcmp(verb, "chown") ||
       !strcmp(verb, "revoke"))) {
    for (int i = 1; i < *argc_io; i++)
      argv[i] = argv[i + 1];
    (*argc_io)--;
  }
}

/* A verb's arguments are checked before connecting: a usage error is exit
 * 2 whether or not gshmd runs.  The listing verbs take none.  Returns 0
 * or the exit status of the usage error (printed). */
static int check_arguments(const char *verb, int argc, char **argv) {
  if (!strcmp(verb, "status") || !strcmp(verb, "peers") || !strcmp(verb, "mappings") ||
      !strcmp(verb, "clients") || !strcmp(verb, "devices") || !strcmp(verb, "metrics")) {
    if (argc > 1)
      return errorf(EXIT_USAGE, -EINVAL, "%s: %s '%s' (it takes none)", verb,
                    argv[1][0] == '-' ? "unknown option" : "unexpected argument", argv[1]);
    return 0;
  }
  return dispatch(NULL, verb, argc, argv);
}

/* Runs verb on a connection to gshmd; returns its exit status. */
static int run_verb(const char *verb, int argc, char **argv) {
  gshm_client_t *c = NULL;
  int rc;

  if ((rc = connect_daemon(&c)))
    return rc;
  rc = dispatch(c, verb, argc, argv);
  gshm_disconnect(c);
  return rc;
}

/* Returns rc, the exit status of what gshmctl did, or EXIT_ERR (said on
 * stderr) where rc is EXIT_OK and what it printed on stdout could not be
 * written (a full disk): a failure, not a success with nothing shown or a
 * cut file; for a verb's output and --help's and --version's alike. */
static int output_written(int rc) {
  int e = gshm__stdout_flush();

  if (e)
    errorf(EXIT_ERR, e, "writing output: %s", strerror(-e));
  return e && rc == EXIT_OK ? EXIT_ERR : rc;
}

/* gshmctl's command line: its options, then the verb's help or the verb.
 * Returns the exit status. */
static int run(int argc, char **argv) {
  const char *verb;
  bool verb_help = false;
  int rc;

  if ((rc = global_options(argc, argv)) >= 0)
    return rc;
  if (optind >= argc) {
    if (json_out)
      return errorf(EXIT_USAGE, -EINVAL, "no verb (gshmctl --help lists them)");
    usage(stderr);
    return EXIT_USAGE;
  }
  verb = argv[optind];
  argc -= optind;
  argv += optind;
  if ((rc = options_after_verb(&argc, argv, &verb_help)))
    return rc;
  if (!strcmp(verb, "help") && argc > 1) { /* "gshmctl help VERB" */
    verb = argv[1];
    verb_help = true;
  } else if (!strcmp(verb, "help") && !verb_help) {
    usage(stdout);
    return EXIT_OK;
  }
  if (verb_help && !strcmp(verb, "help")) /* "help help", "help --help" */
    return verb_usage(verb);
  if (!verb_known(verb))
    return errorf(EXIT_USAGE, -EINVAL, "unknown verb '%s' (gshmctl --help lists them)", verb);
  if (verb_help)
    return verb_usage(verb);
  drop_end_of_options(verb, &argc, argv);
  if ((rc = check_arguments(verb, argc, argv)))
    return rc;
  return run_verb(verb, argc, argv);
}

int main(int argc, char **argv) { return output_written(run(argc, argv)); }
