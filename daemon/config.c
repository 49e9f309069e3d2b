/* gshmd configuration: defaults, INI files (inih), environment and
 * command-line flags, all through the option table in option_table.h. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "option_table.h"
#include "util.h"

#ifndef GSHM_VERSION
#error "GSHM_VERSION comes from project() in CMakeLists.txt"
#endif

enum option_type {
  OPT_STR,      /* any string of min..max bytes */
  OPT_PATH,     /* absolute path of min..max bytes ("" allowed if min is 0) */
  OPT_ENUM,     /* one word of choices */
  OPT_BOOL,     /* true/false/yes/no/on/off/1/0 */
  OPT_U32,      /* decimal */
  OPT_SIZE32,   /* bytes with K/M/G/T suffix, stored in 32 bits */
  OPT_SIZE,     /* bytes with K/M/G/T suffix */
  OPT_MODE,     /* octal permission bits */
  OPT_LOGLEVEL, /* 0..7 or a syslog priority name */
};

/* The C type each option type stores into, checked against the field. */
#define OPT_CTYPE_STR char *
#define OPT_CTYPE_PATH char *
#define OPT_CTYPE_ENUM char *
#define OPT_CTYPE_BOOL bool
#define OPT_CTYPE_U32 uint32_t
#define OPT_CTYPE_SIZE32 uint32_t
#define OPT_CTYPE_SIZE uint64_t
#define OPT_CTYPE_MODE uint32_t
#define OPT_CTYPE_LOGLEVEL int

struct option_def {
  const char *section;
  const char *key;
  enum option_type type;
  size_t offset;
  const char *def;
  uint64_t min, max;
  const char *choices;
  const char *help;
};

#define OPTION_ROW(section_, key_, type_, field_, def_, min_, max_, choices_, help_) \
  {#section_, #key_, OPT_##type_, offsetof(struct gshmd_config, field_), def_, \
   (min_), (max_), (choices_), (help_)},
static const struct option_def options[] = {GSHMD_OPTION_TABLE(OPTION_ROW)};
#undef OPTION_ROW
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

#define OPTION_TYPECHECK(section_, key_, type_, field_, def_, min_, max_, choices_, help_) \
  _Static_assert(__builtin_types_compatible_p(                                 \
                     __typeof__(((struct gshmd_config *)0)->field_), OPT_CTYPE_##type_), \
                 "option " #section_ "." #key_ ": field " #field_ " is not of type " #type_);
GSHMD_OPTION_TABLE(OPTION_TYPECHECK)
#undef OPTION_TYPECHECK

/* Command-line flags; the table also generates the flag part of --help. */
enum {
  FLAG_CONFIG = 'c',
  FLAG_SOCKET = 's',
  FLAG_HELP = 'h',
  FLAG_VERSION = 'V',
  FLAG_BACKEND = 256,
  FLAG_LOG_LEVEL,
  FLAG_LEGACY_IPC,
  FLAG_SET,
  FLAG_CHECK,
  FLAG_PRINT,
  FLAG_DUMP,
};

struct flag_def {
  const char *name;
  int has_arg;
  int val;
  const char *metavar;
  const char *help;
};

static const struct flag_def flags[] = {
    {"config", required_argument, FLAG_CONFIG, "FILE",
     "configuration file (default " GSHMD_DEFAULT_CONFIG ", which may be missing); "
     "FILE's directory conf.d/*.conf drop-ins are read after it"},
    {"socket", required_argument, FLAG_SOCKET, "PATH",
     "listening socket; overrides $GSHM_SOCKET and daemon.socket"},
    {"backend", required_argument, FLAG_BACKEND, "auto|host|cuda", "same as --set daemon.backend=..."},
    {"log-level", required_argument, FLAG_LOG_LEVEL, "N", "same as --set daemon.log_level=N (0..7)"},
    {"legacy-ipc", no_argument, FLAG_LEGACY_IPC, NULL, "same as --set daemon.legacy_ipc=true"},
    {"set", required_argument, FLAG_SET, "SECTION.KEY=VALUE",
     "set any configuration key; may be repeated"},
    {"check-config", no_argument, FLAG_CHECK, NULL,
     "read and validate the configuration, print \"gshmd: configuration ok\" and exit"},
    {"print-config", no_argument, FLAG_PRINT, NULL,
     "print the commented default configuration file (conf/gshmd.conf) and exit"},
    {"dump-config", no_argument, FLAG_DUMP, NULL,
     "print the effective configuration after files, environment and flags, and exit"},
    {"version", no_argument, FLAG_VERSION, NULL, "print the version and exit"},
    {"help", no_argument, FLAG_HELP, NULL, "print this help and exit"},
};
#define N_FLAGS (sizeof(flags) / sizeof(flags[0]))

/* Where a value came from, for error messages. */
struct origin {
  const char *file; /* file name, or a description such as "command line" */
  int line;         /* 0: no line */
};

/* Errors go to stderr; under journald they carry the <3> priority prefix. */
static bool stderr_is_journal(void) {
  const char *js = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;

  if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
    return false;
  return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

__attribute__((format(printf, 1, 2))) static void config_error(const char *fmt, ...) {
  int saved_errno = errno; /* for %m */
  va_list ap;

  fprintf(stderr, "%sgshmd: ", stderr_is_journal() ? "<3>" : "");
  errno = saved_errno;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* Keys that older releases read and this one does not: a config file that
 * still sets one starts gshmd with a warning instead of failing, so that an
 * upgrade never stops the daemon over a key that no longer does anything. */
static const struct {
  const char *section, *key, *why;
} retired_keys[] = {
    {"daemon", "watchdog_sec", "the watchdog follows WatchdogSec= in gshmd.service"},
};

/* If section.key is retired, says so once on stderr (as a warning) and
 * returns true: the caller then ignores the key. */
static bool retired_key(const char *at, const char *section, const char *key) {
  for (size_t i = 0; i < sizeof(retired_keys) / sizeof(retired_keys[0]); i++)
    if (strcmp(retired_keys[i].section, section) == 0 && strcmp(retired_keys[i].key, key) == 0) {
      fprintf(stderr, "%sgshmd: %s: key '%s.%s' is no longer read (%s); ignored\n",
              stderr_is_journal() ? "<4>" : "", at, section, key, retired_keys[i].why);
      return true;
    }
  return false;
}

static const struct option_def *option_find(const char *section, const char *key) {
  for (size_t i = 0; i < N_OPTIONS; i++)
    if (strcmp(options[i].section, section) == 0 && strcmp(options[i].key, key) == 0)
      return &options[i];
  return NULL;
}

/* Parses an unsigned decimal (base 8 if octal) number with an optional
 * binary K/M/G/T suffix (when sizes is set).  Rejects signs, blanks, junk. */
static int parse_number(const char *s, bool sizes, int base, uint64_t *out, const char **why) {
  unsigned long long v;
  uint64_t mult = 1;
  char *end;

  if (*s < '0' || *s > '9') {
    *why = *s ? "not a non-negative number" : "empty value";
    return -EINVAL;
  }
  errno = 0;
  v = strtoull(s, &end, base);
  if (errno == ERANGE) {
    *why = "number too large";
    return -EINVAL;
  }
  if (sizes && *end) {
    switch (*end) {
    case 'k': case 'K': mult = UINT64_C(1) << 10; break;
    case 'm': case 'M': mult = UINT64_C(1) << 20; break;
    case 'g': case 'G': mult = UINT64_C(1) << 30; break;
    case 't': case 'T': mult = UINT64_C(1) << 40; break;
    default:
      *why = "bad size suffix (use K, M, G or T, 1024-based)";
      return -EINVAL;
    }
    end++;
  }
  if (*end) {
    *why = base == 8 ? "not an octal number" : sizes ? "not a size (bytes, or a number with K, M, G or T)"
                                                     : "not a decimal number";
    return -EINVAL;
  }
  if (v > UINT64_MAX / mult) {
    *why = "number too large";
    return -EINVAL;
  }
  *out = (uint64_t)v * mult;
  return 0;
}

static int parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};

  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (strcasecmp(s, yes[i]) == 0) {
      *out = true;
      return 0;
    }
    if (strcasecmp(s, no[i]) == 0) {
      *out = false;
      return 0;
    }
  }
  return -EINVAL;
}

static const struct {
  const char *name;
  int level;
} log_level_names[] = {
    {"emerg", 0}, {"alert", 1},   {"crit", 2},   {"err", 3},   {"error", 3},
    {"warning", 4}, {"warn", 4}, {"notice", 5}, {"info", 6}, {"debug", 7},
};

static bool enum_has(const char *choices, const char *s) {
  size_t n = strlen(s);

  for (const char *p = choices; p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);

    if (n > 0 && len == n && strncmp(p, s, n) == 0)
      return true;
    p = bar ? bar + 1 : NULL;
  }
  return false;
}

/* Validates value for opt and stores it into cfg.  On a bad value returns
 * -EINVAL and points *why at a static explanation (or fills whybuf). */
static int option_set(struct gshmd_config *cfg, const struct option_def *opt, const char *value,
                      const char **why, char *whybuf, size_t whybuf_size) {
  void *field = (char *)cfg + opt->offset;
  uint64_t n = 0;
  bool b;
  int r;

  switch (opt->type) {
  case OPT_STR:
  case OPT_PATH:
  case OPT_ENUM: {
    size_t len = strlen(value);
    char *copy;

    if (opt->type == OPT_ENUM) {
      if (!enum_has(opt->choices, value)) {
        snprintf(whybuf, whybuf_size, "'%s' is not one of %s", value, opt->choices);
        *why = whybuf;
        return -EINVAL;
      }
    } else if (len < opt->min) {
      *why = "must not be empty";
      return -EINVAL;
    } else if (len > opt->max) {
      snprintf(whybuf, whybuf_size, "longer than %" PRIu64 " bytes", opt->max);
      *why = whybuf;
      return -EINVAL;
    } else if (opt->type == OPT_PATH && len > 0 && value[0] != '/') {
      *why = "not an absolute path";
      return -EINVAL;
    }
    copy = strdup(value);
    if (!copy) {
      *why = "out of memory";
      return -ENOMEM;
    }
    free(*(char **)field);
    *(char **)field = copy;
    return 0;
  }
  case OPT_BOOL:
    if (parse_bool(value, &b) < 0) {
      *why = "not a boolean (true/false, yes/no, on/off, 1/0)";
      return -EINVAL;
    }
    *(bool *)field = b;
    return 0;
  case OPT_LOGLEVEL:
    for (size_t i = 0; i < sizeof(log_level_names) / sizeof(log_level_names[0]); i++)
      if (strcasecmp(value, log_level_names[i].name) == 0) {
        *(int *)field = log_level_names[i].level;
        return 0;
      }
    __attribute__((fallthrough));
  case OPT_U32:
  case OPT_SIZE32:
  case OPT_SIZE:
  case OPT_MODE:
    r = parse_number(value, opt->type == OPT_SIZE || opt->type == OPT_SIZE32,
                     opt->type == OPT_MODE ? 8 : 10, &n, why);
    if (r < 0) {
      if (opt->type == OPT_LOGLEVEL)
        *why = "not a log level (0..7 or emerg, alert, crit, err, warning, notice, info, debug)";
      return r;
    }
    if (n < opt->min || n > opt->max) {
      if (opt->type == OPT_MODE)
        snprintf(whybuf, whybuf_size, "%04" PRIo64 " is out of range %04" PRIo64 "..%04" PRIo64, n,
                 opt->min, opt->max);
      else
        snprintf(whybuf, whybuf_size, "%" PRIu64 " is out of range %" PRIu64 "..%" PRIu64, n,
                 opt->min, opt->max);
      *why = whybuf;
      return -EINVAL;
    }
    if (opt->type == OPT_SIZE)
      *(uint64_t *)field = n;
    else if (opt->type == OPT_LOGLEVEL)
      *(int *)field = (int)n;
    else
      *(uint32_t *)field = (uint32_t)n;
    return 0;
  }
  *why = "internal error: unknown option type";
  return -EINVAL;
}

/* Sets "section.key" to value, printing any error once with its origin. */
static int option_set_by_name(struct gshmd_config *cfg, const char *section, const char *key,
                              const char *value, const struct origin *where) {
  const struct option_def *opt = option_find(section, key);
  char whybuf[160];
  const char *why = NULL;
  char at[PATH_MAX + 32];
  int r;

  if (where->line > 0)
    snprintf(at, sizeof(at), "%s:%d", where->file, where->line);
  else
    snprintf(at, sizeof(at), "%s", where->file);
  if (!opt) {
    if (retired_key(at, section, key))
      return 0;
    config_error("%s: unknown key '%s.%s'", at, section, key);
    return -EINVAL;
  }
  r = option_set(cfg, opt, value, &why, whybuf, sizeof(whybuf));
  if (r < 0)
    config_error("%s: key '%s.%s': %s", at, section, key, why);
  return r;
}

/* ---- INI files ---------------------------------------------------------- */

/* State shared by the line-counting reader and the inih handler: inih in
 * Debian is built without INI_HANDLER_LINENO, so the reader counts lines. */
struct ini_state {
  struct gshmd_config *cfg;
  FILE *fp;
  const char *path;
  int line;          /* line of the chunk inih is processing */
  bool at_line_start;
  int error;         /* first handler error, negative errno; stops the reader */
  int error_line;
  char message[PATH_MAX + 256];
};

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
      snprintf(st->message, sizeof(st->message), "%s:%d: line longer than %d bytes", st->path,
               st->line, num - 3);
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
  return str;
}

static int ini_state_handle(void *user, const char *section, const char *name, const char *value) {
  struct ini_state *st = user;
  const struct option_def *opt;
  char whybuf[160];
  const char *why = NULL;
  int r;

  if (st->error < 0)
    return 0;
  opt = option_find(section, name);
  if (!opt) {
    char at[PATH_MAX + 32];

    snprintf(at, sizeof(at), "%s:%d", st->path, st->line);
    if (retired_key(at, section, name))
      return 1;
    r = -EINVAL;
    if (section[0] == '\0')
      snprintf(st->message, sizeof(st->message),
               "%s:%d: unknown key '%s' (every key belongs in a [section])", st->path, st->line,
               name);
    else
      snprintf(st->message, sizeof(st->message), "%s:%d: unknown key '%s.%s'", st->path, st->line,
               section, name);
  } else {
    r = option_set(st->cfg, opt, value, &why, whybuf, sizeof(whybuf));
    if (r == 0)
      return 1;
    snprintf(st->message, sizeof(st->message), "%s:%d: key '%s.%s': %s", st->path, st->line,
             section, name, why);
  }
  st->error = r;
  st->error_line = st->line;
  return 0;
}

/* Parses one INI file into cfg.  A missing file is -ENOENT, reported unless
 * quiet_missing. */
static int config_load_file(struct gshmd_config *cfg, const char *path, bool quiet_missing) {
  struct ini_state st = {.cfg = cfg, .path = path, .at_line_start = true};
  int r;

  st.fp = fopen(path, "re");
  if (!st.fp) {
    r = -errno;
    if (!(quiet_missing && r == -ENOENT))
      config_error("cannot open configuration file %s: %m", path);
    return r;
  }
  r = ini_parse_stream(ini_state_read, &st, ini_state_handle, &st);
  if (ferror(st.fp)) {
    r = errno ? -errno : -EIO;
    config_error("cannot read configuration file %s: %s", path, strerror(-r));
  } else if (r > 0 && (st.error == 0 || r < st.error_line)) {
    /* inih found a malformed line before any value error. */
    config_error("%s:%d: syntax error (expected '[section]' or 'key = value')", path, r);
    r = -EINVAL;
  } else if (st.error < 0) {
    config_error("%s", st.message);
    r = st.error;
  } else if (r < 0) {
    config_error("cannot parse configuration file %s: out of memory", path);
    r = -ENOMEM;
  }
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
 * fine. */
static int config_load_dropins(struct gshmd_config *cfg, const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[PATH_MAX], file[PATH_MAX];
  struct dirent **names = NULL;
  int n, r = 0;

  if (!slash)
    snprintf(dir, sizeof(dir), "conf.d");
  else if ((size_t)snprintf(dir, sizeof(dir), "%.*s/conf.d", (int)(slash - path), path) >=
           sizeof(dir)) {
    config_error("configuration path too long: %s", path);
    return -ENAMETOOLONG;
  }
  n = scandir(dir, &names, dropin_filter, dropin_compare);
  if (n < 0) {
    r = -errno;
    if (r == -ENOENT || r == -ENOTDIR)
      return 0;
    config_error("cannot read drop-in directory %s: %m", dir);
    return r;
  }
  for (int i = 0; i < n; i++) {
    struct stat stbuf;

    if (r == 0) {
      if ((size_t)snprintf(file, sizeof(file), "%s/%s", dir, names[i]->d_name) >= sizeof(file)) {
        config_error("drop-in path too long: %s/%s", dir, names[i]->d_name);
        r = -ENAMETOOLONG;
      } else if (stat(file, &stbuf) == 0 && !S_ISREG(stbuf.st_mode)) {
        /* directories and the like named *.conf are not drop-ins */
      } else {
        r = config_load_file(cfg, file, false);
      }
    }
    free(names[i]);
  }
  free(names);
  return r;
}

/* ---- output: --help, --print-config, --dump-config ---------------------- */

/* Writes text wrapped at width columns: the first line starts with first,
 * the others with prefix. */
static void print_wrapped(FILE *f, const char *first, const char *prefix, const char *text,
                          size_t width) {
  while (*text) {
    size_t plen = strlen(first ? first : prefix);
    size_t room = width > plen + 20 ? width - plen : 20;
    size_t len = strlen(text), cut = len;

    if (len > room) {
      cut = room;
      while (cut > 0 && text[cut] != ' ')
        cut--;
      if (cut == 0) /* one long word: break after it */
        for (cut = room; text[cut] && text[cut] != ' ';)
          cut++;
    }
    fprintf(f, "%s%.*s\n", first ? first : prefix, (int)cut, text);
    first = NULL;
    text += cut;
    while (*text == ' ')
      text++;
  }
}

static const char *option_type_doc(const struct option_def *opt, char *buf, size_t size) {
  switch (opt->type) {
  case OPT_STR: return "string";
  case OPT_PATH: return opt->min ? "absolute path" : "absolute path, or empty";
  case OPT_ENUM: return opt->choices;
  case OPT_BOOL: return "boolean";
  case OPT_MODE: return "octal mode";
  case OPT_LOGLEVEL: return "log level 0..7";
  case OPT_SIZE:
  case OPT_SIZE32:
    if (opt->max == UINT64_MAX)
      return "bytes; K/M/G/T suffixes are 1024-based";
    snprintf(buf, size, "bytes %" PRIu64 "..%" PRIu64 "; K/M/G/T suffixes are 1024-based",
             opt->min, opt->max);
    return buf;
  case OPT_U32:
    snprintf(buf, size, "integer %" PRIu64 "..%" PRIu64, opt->min, opt->max);
    return buf;
  }
  return "?";
}

#define HELP_COLUMN 28
#define HELP_INDENT "                            " /* HELP_COLUMN spaces */

static void print_usage(FILE *f) {
  char line[128];

  fprintf(f, "Usage: gshmd [OPTION]...\n"
             "Per-node daemon that shares GPU and host memory segments between processes.\n"
             "\n"
             "Options:\n");
  for (size_t i = 0; i < N_FLAGS; i++) {
    const struct flag_def *fl = &flags[i];
    int n;

    _Static_assert(sizeof(HELP_INDENT) == HELP_COLUMN + 1, "HELP_INDENT");
    if (fl->val < 256)
      n = snprintf(line, sizeof(line), "  -%c, --%s%s%s", fl->val, fl->name, fl->metavar ? " " : "",
                   fl->metavar ? fl->metavar : "");
    else
      n = snprintf(line, sizeof(line), "      --%s%s%s", fl->name, fl->metavar ? " " : "",
                   fl->metavar ? fl->metavar : "");
    if (n >= HELP_COLUMN) {
      fprintf(f, "%s\n", line);
      print_wrapped(f, NULL, HELP_INDENT, fl->help, 79);
    } else {
      snprintf(line + n, sizeof(line) - (size_t)n, "%*s", HELP_COLUMN - n, "");
      print_wrapped(f, line, HELP_INDENT, fl->help, 79);
    }
  }
  fprintf(f, "\n"
             "Environment:\n"
             "  GSHM_SOCKET               overrides daemon.socket; --socket overrides it\n"
             "\n"
             "Configuration keys (set in the file as [SECTION] KEY = VALUE, or with\n"
             "--set SECTION.KEY=VALUE; the default follows '='):\n");
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const struct option_def *opt = &options[i];
    char tbuf[96];

    fprintf(f, "  %s.%s = %s  (%s)\n", opt->section, opt->key, opt->def[0] ? opt->def : "\"\"",
            option_type_doc(opt, tbuf, sizeof(tbuf)));
    print_wrapped(f, NULL, "      ", opt->help, 79);
  }
  fprintf(f, "\nSee gshmd --print-config for a commented configuration file.\n");
}

/* Formats the value of opt in cfg the way the INI parser reads it back. */
static void option_format(const struct gshmd_config *cfg, const struct option_def *opt, char *buf,
                          size_t size) {
  const void *field = (const char *)cfg + opt->offset;

  switch (opt->type) {
  case OPT_STR:
  case OPT_PATH:
  case OPT_ENUM:
    snprintf(buf, size, "%s", *(char *const *)field ? *(char *const *)field : "");
    break;
  case OPT_BOOL:
    snprintf(buf, size, "%s", *(const bool *)field ? "true" : "false");
    break;
  case OPT_LOGLEVEL:
    snprintf(buf, size, "%d", *(const int *)field);
    break;
  case OPT_MODE:
    snprintf(buf, size, "%04" PRIo32, *(const uint32_t *)field);
    break;
  case OPT_U32:
  case OPT_SIZE32:
    snprintf(buf, size, "%" PRIu32, *(const uint32_t *)field);
    break;
  case OPT_SIZE:
    snprintf(buf, size, "%" PRIu64, *(const uint64_t *)field);
    break;
  }
}

static void print_key_value(FILE *f, const char *prefix, const char *key, const char *value) {
  fprintf(f, "%s%s =%s%s\n", prefix, key, value[0] ? " " : "", value);
}

/* Writes conf/gshmd.conf: every key commented out with its default. */
static void print_default_config(FILE *f) {
  const char *section = NULL;

  fputs("# gshmd configuration (INI).\n"
        "#\n"
        "# Every key is listed, commented out, with its built-in default. To change\n"
        "# one, uncomment it under its [section]. Files in conf.d/*.conf next to this\n"
        "# file are read after it in lexical order and override it; the environment\n"
        "# ($GSHM_SOCKET) and command-line flags override both. Unknown keys and bad\n"
        "# values are errors; check with: gshmd --check-config\n"
        "#\n"
        "# A comment starts a line or follows a value after a blank (\"key = v  # why\").\n"
        "# Lines are at most 197 bytes (libinih's buffer); set a longer value, such\n"
        "# as a deep textfile path, with --set SECTION.KEY=VALUE.\n"
        "#\n"
        "# Generated by gshmd --print-config from the daemon's option table.\n",
        f);
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const struct option_def *opt = &options[i];
    char tbuf[96];

    if (!section || strcmp(section, opt->section) != 0) {
      section = opt->section;
      fprintf(f, "\n[%s]\n", section);
    }
    fputc('\n', f);
    print_wrapped(f, NULL, "# ", opt->help, 78);
    fprintf(f, "# Type: %s.\n", option_type_doc(opt, tbuf, sizeof(tbuf)));
    print_key_value(f, "#", opt->key, opt->def);
  }
}

/* Writes the effective configuration as an INI file that parses back. */
static void print_effective_config(FILE *f, const struct gshmd_config *cfg) {
  const char *section = NULL;
  char value[PATH_MAX + 1];

  for (size_t i = 0; i < N_OPTIONS; i++) {
    const struct option_def *opt = &options[i];

    if (!section || strcmp(section, opt->section) != 0) {
      fprintf(f, "%s[%s]\n", section ? "\n" : "", opt->section);
      section = opt->section;
    }
    option_format(cfg, opt, value, sizeof(value));
    print_key_value(f, "", opt->key, value);
  }
}

/* ---- public ------------------------------------------------------------- */

int gshmd_config_init(struct gshmd_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  for (size_t i = 0; i < N_OPTIONS; i++) {
    char whybuf[160];
    const char *why = NULL;
    int r = option_set(cfg, &options[i], options[i].def, &why, whybuf, sizeof(whybuf));

    if (r < 0) {
      if (r != -ENOMEM) /* a bad default is a bug in option_table.h */
        config_error("built-in default of '%s.%s': %s", options[i].section, options[i].key, why);
      gshmd_config_free(cfg);
      return r;
    }
  }
  /* poll_us's default holds where gshmd can poll without taking the CPU
   * its clients need; a value from a file or --set applies everywhere. */
  if (gshm__usable_cpus() < GSHM_POLL_MIN_CPUS)
    cfg->poll_us = 0;
  return 0;
}

void gshmd_config_free(struct gshmd_config *cfg) {
  if (!cfg)
    return;
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const struct option_def *opt = &options[i];

    if (opt->type == OPT_STR || opt->type == OPT_PATH || opt->type == OPT_ENUM) {
      char **field = (char **)((char *)cfg + opt->offset);

      free(*field);
      *field = NULL;
    }
  }
}

/* A flag that sets a configuration key, kept until the files are read. */
struct override {
  int flag;          /* FLAG_* */
  const char *arg;   /* argv string, lives as long as argv */
};

static int override_apply(struct gshmd_config *cfg, const struct override *ov) {
  struct origin where = {.line = 0};
  char section[64], key[64];
  const char *dot, *eq;

  switch (ov->flag) {
  case FLAG_SOCKET:
    where.file = "--socket";
    return option_set_by_name(cfg, "daemon", "socket", ov->arg, &where);
  case FLAG_BACKEND:
    where.file = "--backend";
    return option_set_by_name(cfg, "daemon", "backend", ov->arg, &where);
  case FLAG_LOG_LEVEL:
    where.file = "--log-level";
    return option_set_by_name(cfg, "daemon", "log_level", ov->arg, &where);
  case FLAG_LEGACY_IPC:
    where.file = "--legacy-ipc";
    return option_set_by_name(cfg, "daemon", "legacy_ipc", "true", &where);
  case FLAG_SET:
    dot = strchr(ov->arg, '.');
    eq = strchr(ov->arg, '=');
    if (!dot || !eq || dot > eq || (size_t)(dot - ov->arg) >= sizeof(section) ||
        (size_t)(eq - dot - 1) >= sizeof(key)) {
      config_error("--set %s: expected SECTION.KEY=VALUE", ov->arg);
      return -EINVAL;
    }
    snprintf(section, sizeof(section), "%.*s", (int)(dot - ov->arg), ov->arg);
    snprintf(key, sizeof(key), "%.*s", (int)(eq - dot - 1), dot + 1);
    where.file = "--set";
    return option_set_by_name(cfg, section, key, eq + 1, &where);
  }
  return -EINVAL;
}

static void usage_hint(void) {
  fprintf(stderr, "Try 'gshmd --help' for more information.\n");
}

int gshmd_config_setup(struct gshmd_config *cfg, int argc, char **argv,
                       enum gshmd_config_action *action_out) {
  struct option longopts[N_FLAGS + 1];
  struct override *overrides = NULL;
  size_t n_overrides = 0;
  const char *config_path = NULL, *env;
  bool check = false, dump = false;
  int c, r = 0;

  for (size_t i = 0; i < N_FLAGS; i++)
    longopts[i] = (struct option){flags[i].name, flags[i].has_arg, NULL, flags[i].val};
  longopts[N_FLAGS] = (struct option){0};

  overrides = calloc(argc > 0 ? (size_t)argc : 1, sizeof(*overrides));
  if (!overrides) {
    config_error("out of memory");
    return -ENOMEM;
  }

  opterr = 0; /* our own messages, prefixed "gshmd:" */
  optind = 0; /* full getopt reset, so that setup may run more than once */
  while ((c = getopt_long(argc, argv, ":c:s:hV", longopts, NULL)) != -1) {
    switch (c) {
    case FLAG_CONFIG:
      config_path = optarg;
      break;
    case FLAG_SOCKET:
    case FLAG_BACKEND:
    case FLAG_LOG_LEVEL:
    case FLAG_LEGACY_IPC:
    case FLAG_SET:
      overrides[n_overrides++] = (struct override){c, optarg};
      break;
    case FLAG_CHECK:
      check = true;
      break;
    case FLAG_DUMP:
      dump = true;
      break;
    case FLAG_PRINT:
      print_default_config(stdout);
      goto exit_ok;
    case FLAG_HELP:
      print_usage(stdout);
      goto exit_ok;
    case FLAG_VERSION:
      printf("gshmd " GSHM_VERSION "\n");
      goto exit_ok;
    case ':':
      config_error("option '%s' requires an argument", argv[optind - 1]);
      usage_hint();
      r = -EINVAL;
      goto out;
    default:
      if (optopt && optopt < 256)
        config_error("invalid option '-%c'", optopt);
      else
        config_error("unrecognized option '%s'", argv[optind - 1]);
      usage_hint();
      r = -EINVAL;
      goto out;
    }
  }
  if (optind < argc) {
    config_error("unexpected argument '%s'", argv[optind]);
    usage_hint();
    r = -EINVAL;
    goto out;
  }

  r = config_load_file(cfg, config_path ? config_path : GSHMD_DEFAULT_CONFIG, !config_path);
  if (r < 0 && !(r == -ENOENT && !config_path))
    goto out;
  r = config_load_dropins(cfg, config_path ? config_path : GSHMD_DEFAULT_CONFIG);
  if (r < 0)
    goto out;

  env = getenv("GSHM_SOCKET");
  if (env && env[0]) {
    struct origin where = {.file = "$GSHM_SOCKET"};

    r = option_set_by_name(cfg, "daemon", "socket", env, &where);
    if (r < 0)
      goto out;
  }

  for (size_t i = 0; i < n_overrides; i++) {
    r = override_apply(cfg, &overrides[i]);
    if (r < 0)
      goto out;
  }

  /* Values whose form the option table cannot express: checked here so
   * that --check-config finds what would stop gshmd later. */
  if (cfg->metrics_http_listen && *cfg->metrics_http_listen) {
    struct sockaddr_storage sa;
    socklen_t salen;
    if (gshm__parse_loopback(cfg->metrics_http_listen, &sa, &salen)) {
      config_error("metrics.http_listen '%s': want a loopback ADDRESS:PORT such as "
                   "127.0.0.1:9477",
                   cfg->metrics_http_listen);
      r = -EINVAL;
      goto out;
    }
  }
  /* One list item must fit in one reply: the largest is a lease (segment
   * name, client name, location, 8 device UUIDs and a dozen numbers:
   * under 1 KiB besides the name), within max_packet less the header and
   * the reply's own fields (requests.c list_budget). */
  if ((uint64_t)cfg->max_name + GSHMD_LIST_ITEM_OVERHEAD > (uint64_t)cfg->max_packet - 16 - 64) {
    config_error("limits.max_name %u: a list item with a name that long does not fit in one "
                 "reply of limits.max_packet %u bytes (names up to %u fit)",
                 cfg->max_name, cfg->max_packet,
                 cfg->max_packet - 16 - 64 - GSHMD_LIST_ITEM_OVERHEAD);
    r = -EINVAL;
    goto out;
  }
  if (check && cfg->admin_group && *cfg->admin_group && !getgrnam(cfg->admin_group)) {
    config_error("daemon.admin_group '%s': no such group", cfg->admin_group);
    r = -EINVAL;
    goto out;
  }

  if (dump)
    print_effective_config(stdout, cfg);
  if (check) {
    /* the caller checks what other layers read (the cluster's keys) and
     * says "configuration ok" */
    *action_out = GSHMD_CONFIG_CHECK;
    r = 0;
    goto out;
  }
  if (dump)
    goto exit_ok;
  *action_out = GSHMD_CONFIG_RUN;
  r = 0;
  goto out;

exit_ok:
  fflush(stdout);
  *action_out = GSHMD_CONFIG_EXIT_OK;
  r = 0;
out:
  free(overrides);
  return r;
}
