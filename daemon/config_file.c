/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's INI configuration files: the file itself (through inih, with
 * our line counting, '#' comments and indentation rules) and its conf.d
 * drop-ins.  Values go through the option table (config.c); a key set
 * twice in one file is taken (the last value) with a warning.  A line of
 * a list key (LIST_KEYS) that ends with '\' continues on the next line:
 * Debian's inih holds a line to 200 bytes, 8 peers of cluster.peers. */
#include <dirent.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config_internal.h"

/* Where one key of the option table was set in the file being read: inih
 * hands over every occurrence and the last one wins, which a file that
 * sets a key twice (an edit appended below an old line) never says. */
struct key_seen {
  int first, last, count; /* lines; count 0: not set in this file */
  char *value;            /* the last value, kept once the key is set again */
};

/* State shared by the line-counting reader and the inih handler: inih in
 * Debian is built without INI_HANDLER_LINENO, so the reader counts lines. */
struct ini_state {
  struct gshmd_config *cfg;
  FILE *fp;
  const char *path;
  int line;          /* line of the chunk inih is processing */
  bool at_line_start;
  bool cont_next;    /* the line read last ended with '\\': the next continues its key */
  bool cont;         /* the line inih is processing continues the key above */
  int error;         /* first handler error, negative errno; stops the reader */
  int error_line;
  char message[PATH_MAX + 256];
  struct key_seen *seen; /* one per option table row; NULL: not counted (no memory) */
};

/* Counts a setting of opt to value at the current line. */
static void key_seen_note(struct ini_state *st, const struct option_def *opt, const char *value) {
  struct key_seen *k;

  if (!st->seen)
    return;
  k = &st->seen[opt - gshmd__config_options];
  if (!k->count++)
    k->first = st->line;
  k->last = st->line;
  if (k->count > 1) {
    free(k->value);
    k->value = strdup(value);
  }
}

/* Warns once for each key the file set more than once, naming the value
 * that wins (the last); frees the counts. */
static void key_seen_report(struct ini_state *st, bool warn) {
  if (!st->seen)
    return;
  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *opt = &gshmd__config_options[i];
    struct key_seen *k = &st->seen[i];
    if (warn && k->count > 1)
      gshmd__config_warning("%s:%d: key '%s.%s' is set %d times in this file (first on line %d): "
                            "the last value, '%s' on line %d, wins",
                            st->path, k->last, opt->section, opt->key, k->count, k->first,
                            k->value ? k->value : "", k->last);
    free(k->value);
  }
  free(st->seen);
  st->seen = NULL;
}

bool gshmd__config_list_key(const char *section, const char *name) {
  return !strcmp(section, "cluster") && (!strcmp(name, "peers") || !strcmp(name, "export"));
}

/* What to do with a line past libinih's buffer (conf/gshmd.conf says it). */
#define LONG_LINE_HINT                                                                         \
  " (give a longer value with --set SECTION.KEY=VALUE; a line of cluster.peers or "             \
  "cluster.export that ends with '\\' goes on on the next)"

/* Ends str (one line, comments gone) at a '\\' that ends it, noting that
 * the next line continues; then, where this line continues the one above,
 * starts it with a blank, which makes inih hand it over under the key
 * above.  Returns false when no byte is left for that blank. */
static bool line_continues(struct ini_state *st, char *str, int num) {
  size_t len = strlen(str);

  st->cont = st->cont_next;
  while (len && strchr(" \t\r\n", str[len - 1]))
    len--;
  /* (a comment's or a section's '\\' continues nothing) */
  st->cont_next = len && str[len - 1] == '\\' && !strchr("#;[", str[0]);
  if (st->cont_next)
    strcpy(str + len - 1, "\n");
  if (!st->cont || !len)
    return true;
  len = strlen(str);
  if ((int)len + 2 > num)
    return false;
  memmove(str + 1, str, len + 1);
  str[0] = ' ';
  return true;
}

static char *ini_state_read(char *str, int num, void *stream) {
  struct ini_state *st = stream;
  size_t len;
  int c;

  if (st->error < 0)
    return NULL; /* stop at the first error: later lines would only add noise */
  if (!fgets(str, num, st->fp))
    return NULL;
  if (st->at_line_start)
    st->line++;
  len = strlen(str);
  st->at_line_start = len > 0 && str[len - 1] == '\n';
  if (!st->at_line_start && (int)len == num - 1) {
    c = getc(st->fp);
    if (c != EOF) {
      ungetc(c, st->fp);
      st->error = -EINVAL;
      st->error_line = st->line;
      snprintf(st->message, sizeof(st->message),
               "%s:%d: line longer than %d bytes" LONG_LINE_HINT, st->path, st->line, num - 3);
      return NULL;
    }
  }
  /* Debian's inih takes a line that starts with blanks as the continuation
   * of the key above (multi-line values): "  admin_group = x" under
   * "socket_group = y" became socket_group's value.  Indentation means
   * nothing in gshmd.conf, so drop it. */
  if (len && (str[0] == ' ' || str[0] == '\t')) {
    size_t skip = strspn(str, " \t");
    memmove(str, str + skip, len - skip + 1);
  }
  /* A '#' after a blank starts a comment, as in the generated file's style
   * ("socket_group = gshm  # who may connect"); inih only knows ';' there,
   * and kept the rest as part of the value. */
  for (char *p = str + 1; *p; p++)
    if (*p == '#' && (p[-1] == ' ' || p[-1] == '\t')) {
      *p++ = '\n';
      *p = '\0';
      break;
    }
  if (!line_continues(st, str, num)) {
    st->error = -EINVAL;
    st->error_line = st->line;
    snprintf(st->message, sizeof(st->message),
             "%s:%d: line longer than %d bytes" LONG_LINE_HINT, st->path, st->line, num - 4);
    return NULL;
  }
  return str;
}

/* Adds value, a continuation line, to the list opt holds (a blank
 * between), on the heap: the joined list is held to opt's own cap
 * (GSHMD_CONFIG_LIST_MAX), not to a line's.  Returns 1, or 0 with
 * st->error set. */
static int continue_value(struct ini_state *st, const struct option_def *opt,
                          const char *value) {
  const char *old = *(char **)((char *)st->cfg + opt->offset), *why = NULL;
  size_t len = strlen(old ? old : "") + 1 + strlen(value) + 1;
  char *joined = malloc(len), whybuf[160];
  int r = joined ? 0 : -ENOMEM;

  if (joined) {
    snprintf(joined, len, "%s%s%s", old ? old : "", old && *old ? " " : "", value);
    r = gshmd__config_option_set(st->cfg, opt, joined, &why, whybuf, sizeof(whybuf));
    free(joined);
  }
  if (r == 0)
    return 1;
  snprintf(st->message, sizeof(st->message), "%s:%d: key '%s.%s': %s", st->path, st->line,
           opt->section, opt->key, why ? why : strerror(-r));
  st->error = r;
  st->error_line = st->line;
  return 0;
}

static int ini_state_handle(void *user, const char *section, const char *name, const char *value) {
  struct ini_state *st = user;
  const struct option_def *opt;
  char whybuf[160];
  const char *why = NULL;
  int r;

  if (st->error < 0)
    return 0;
  opt = gshmd__config_option_find(section, name);
  if (!opt) {
    char at[PATH_MAX + 32];

    snprintf(at, sizeof(at), "%s:%d", st->path, st->line);
    if (gshmd__config_retired_key(at, section, name))
      return 1;
    char hint[160];

    r = -EINVAL;
    gshmd__config_unknown_hint(section, name, hint, sizeof(hint));
    if (section[0] == '\0')
      snprintf(st->message, sizeof(st->message),
               "%s:%d: unknown key '%s': every key belongs in a [section]%s", st->path,
               st->line, name, hint);
    else
      snprintf(st->message, sizeof(st->message), "%s:%d: unknown key '%s.%s'%s", st->path,
               st->line, section, name, hint);
  } else if (st->cont && !gshmd__config_list_key(section, name)) {
    r = -EINVAL;
    snprintf(st->message, sizeof(st->message), "%s:%d: key '%s.%s': only cluster.peers and "
             "cluster.export continue on the next line (a '\\' ends the line above)",
             st->path, st->line, section, name);
  } else if (st->cont) {
    return continue_value(st, opt, value);
  } else {
    r = gshmd__config_option_set(st->cfg, opt, value, &why, whybuf, sizeof(whybuf));
    if (r == 0) {
      key_seen_note(st, opt, value);
      return 1;
    }
    snprintf(st->message, sizeof(st->message), "%s:%d: key '%s.%s': %s", st->path, st->line,
             section, name, why);
  }
  st->error = r;
  st->error_line = st->line;
  return 0;
}

/* Parses one INI file into cfg.  A missing file is -ENOENT, reported unless
 * quiet_missing. */
int gshmd__config_load_file(struct gshmd_config *cfg, const char *path, bool quiet_missing) {
  struct ini_state st = {.cfg = cfg, .path = path, .at_line_start = true};
  int r;

  st.fp = fopen(path, "re");
  if (!st.fp) {
    r = -errno;
    if (!(quiet_missing && r == -ENOENT))
      gshmd__config_error("cannot open configuration file %s: %m", path);
    return r;
  }
  st.seen = calloc(gshmd__config_noptions, sizeof(*st.seen));
  r = ini_parse_stream(ini_state_read, &st, ini_state_handle, &st);
  if (ferror(st.fp)) {
    r = errno ? -errno : -EIO;
    gshmd__config_error("cannot read configuration file %s: %s", path, strerror(-r));
  } else if (r > 0 && (st.error == 0 || r < st.error_line)) {
    /* inih found a malformed line before any value error. */
    gshmd__config_error("%s:%d: syntax error (expected '[section]' or 'key = value')", path, r);
    r = -EINVAL;
  } else if (st.error < 0) {
    gshmd__config_error("%s", st.message);
    r = st.error;
  } else if (r < 0) {
    gshmd__config_error("cannot parse configuration file %s: out of memory", path);
    r = -ENOMEM;
  }
  key_seen_report(&st, r == 0);
  fclose(st.fp);
  return r;
}

static int dropin_filter(const struct dirent *de) {
  size_t len = strlen(de->d_name);

  return de->d_name[0] != '.' && len > 5 && strcmp(de->d_name + len - 5, ".conf") == 0;
}

static int dropin_compare(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name); /* bytewise, whatever the locale */
}

/* Reads <dir of path>/conf.d/ *.conf in lexical order; a missing conf.d is
 * fine.  Returns the number read or a negative errno. */
int gshmd__config_load_dropins(struct gshmd_config *cfg, const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[PATH_MAX], file[PATH_MAX];
  struct dirent **names = NULL;
  int n, r = 0, read = 0;

  if (!slash)
    snprintf(dir, sizeof(dir), "conf.d");
  else if ((size_t)snprintf(dir, sizeof(dir), "%.*s/conf.d", (int)(slash - path), path) >=
           sizeof(dir)) {
    gshmd__config_error("configuration path too long: %s", path);
    return -ENAMETOOLONG;
  }
  n = scandir(dir, &names, dropin_filter, dropin_compare);
  if (n < 0) {
    r = -errno;
    if (r == -ENOENT || r == -ENOTDIR)
      return 0;
    gshmd__config_error("cannot read drop-in directory %s: %m", dir);
    return r;
  }
  for (int i = 0; i < n; i++) {
    struct stat stbuf;

    if (r == 0) {
      if ((size_t)snprintf(file, sizeof(file), "%s/%s", dir, names[i]->d_name) >= sizeof(file)) {
        gshmd__config_error("drop-in path too long: %s/%s", dir, names[i]->d_name);
        r = -ENAMETOOLONG;
      } else if (stat(file, &stbuf) == 0 && !S_ISREG(stbuf.st_mode)) {
        /* directories and the like named *.conf are not drop-ins */
      } else {
        r = gshmd__config_load_file(cfg, file, false);
        read += r == 0;
      }
    }
    free(names[i]);
  }
  free(names);
  return r < 0 ? r : read;
}
