/* SPDX-License-Identifier: Apache-2.0 */
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

#include "config_internal.h"
#include "option_table.h"
#include "user_switch.h"
#include "util.h"

#ifndef GSHM_VERSION
#error "GSHM_VERSION comes from project() in CMakeLists.txt"
#endif

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

#define OPTION_ROW(section_, key_, type_, field_, def_, min_, max_, choices_, help_) \
  {#section_, #key_, OPT_##type_, offsetof(struct gshmd_config, field_), def_, \
   (min_), (max_), (choices_), (help_)},
const struct option_def gshmd__config_options[] = {GSHMD_OPTION_TABLE(OPTION_ROW)};
#undef OPTION_ROW
const size_t gshmd__config_noptions =
    sizeof(gshmd__config_options) / sizeof(gshmd__config_options[0]);

#define OPTION_TYPECHECK(section_, key_, type_, field_, def_, min_, max_, choices_, help_) \
  _Static_assert(__builtin_types_compatible_p(                                 \
                     __typeof__(((struct gshmd_config *)0)->field_), OPT_CTYPE_##type_), \
                 "option " #section_ "." #key_ ": field " #field_ " is not of type " #type_);
GSHMD_OPTION_TABLE(OPTION_TYPECHECK)
#undef OPTION_TYPECHECK

const struct flag_def gshmd__config_flags[] = {
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
     "read and validate the configuration, print \"gshmd: configuration ok\" with the "
     "files it read, and exit"},
    {"print-config", no_argument, FLAG_PRINT, NULL,
     "print the commented default configuration file (conf/gshmd.conf) and exit"},
    {"dump-config", no_argument, FLAG_DUMP, NULL,
     "print the effective configuration after files, environment and flags, and exit"},
    {"version", no_argument, FLAG_VERSION, NULL, "print the version and exit"},
    {"help", no_argument, FLAG_HELP, NULL, "print this help and exit"},
};
const size_t gshmd__config_nflags = sizeof(gshmd__config_flags) / sizeof(gshmd__config_flags[0]);

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

void gshmd__config_error(const char *fmt, ...) {
  int saved_errno = errno; /* for %m */
  va_list ap;

  fprintf(stderr, "%sgshmd: ", stderr_is_journal() ? "<3>" : "");
  errno = saved_errno;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

void gshmd__config_warning(const char *fmt, ...) {
  va_list ap;

  fprintf(stderr, "%sgshmd: warning: ", stderr_is_journal() ? "<4>" : "");
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

/* config_internal.h */
bool gshmd__config_retired_key(const char *at, const char *section, const char *key) {
  for (size_t i = 0; i < sizeof(retired_keys) / sizeof(retired_keys[0]); i++)
    if (strcmp(retired_keys[i].section, section) == 0 && strcmp(retired_keys[i].key, key) == 0) {
      fprintf(stderr, "%sgshmd: %s: key '%s.%s' is no longer read (%s); ignored\n",
              stderr_is_journal() ? "<4>" : "", at, section, key, retired_keys[i].why);
      return true;
    }
  return false;
}

const struct option_def *gshmd__config_option_find(const char *section, const char *key) {
  for (size_t i = 0; i < gshmd__config_noptions; i++)
    if (strcmp(gshmd__config_options[i].section, section) == 0 &&
        strcmp(gshmd__config_options[i].key, key) == 0)
      return &gshmd__config_options[i];
  return NULL;
}

/* Edit distance of a and b (an insertion, a deletion, a substitution or a
 * swap of two neighbours each count 1); 99 for words of 48 bytes or more. */
static unsigned typo_distance(const char *a, const char *b) {
  unsigned d[3][48], *prev2 = d[0], *prev = d[1], *cur = d[2], *t;
  size_t la = strlen(a), lb = strlen(b);

  if (la >= 48 || lb >= 48)
    return 99;
  for (size_t j = 0; j <= lb; j++)
    prev[j] = (unsigned)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (unsigned)i;
    for (size_t j = 1; j <= lb; j++) {
      unsigned v = prev[j - 1] + (a[i - 1] != b[j - 1]);
      v = prev[j] + 1 < v ? prev[j] + 1 : v;
      v = cur[j - 1] + 1 < v ? cur[j - 1] + 1 : v;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev2[j - 2] + 1 < v)
        v = prev2[j - 2] + 1;
      cur[j] = v;
    }
    t = prev2, prev2 = prev, prev = cur, cur = t;
  }
  return prev[lb];
}

/* config_internal.h */
void gshmd__config_unknown_hint(const char *section, const char *key, char *out, size_t n) {
  const struct option_def *best = NULL;
  unsigned best_d = 3; /* (2 at most: one typo in each of section and key, or a key of
                        * another section with none) */
  bool tied = false;

  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *o = &gshmd__config_options[i];
    unsigned dk = typo_distance(key, o->key), d;
    /* (the start of a key counts as one typo: "secret" for secret_file) */
    if (strlen(key) >= 4 && !strncmp(o->key, key, strlen(key)) && dk > 1)
      dk = 1;
    d = dk + typo_distance(section, o->section);
    d = dk + 2 < d ? dk + 2 : d;
    if (d < best_d)
      best = o, best_d = d, tied = false;
    else if (best && d == best_d)
      tied = true;
  }
  if (best && !tied) /* (two as near: no guess, "host" for host_populate or host_recycle) */
    snprintf(out, n, " (did you mean '%s.%s'? gshmd --help lists every key)", best->section,
             best->key);
  else
    snprintf(out, n, " (gshmd --help lists every key)");
}

/* Parses an unsigned decimal (base 8 if octal) number, or (when sizes is
 * set) a size as gshmctl reads one: K, M, G or T alone, with B or with
 * iB, all 1024-based (gshm__parse_size).  Rejects signs, blanks, junk. */
static int parse_number(const char *s, bool sizes, int base, uint64_t *out, const char **why) {
  unsigned long long v;
  char *end;
  int e;

  if (*s < '0' || *s > '9') {
    *why = *s ? "not a non-negative number" : "empty value";
    return -EINVAL;
  }
  if (sizes) {
    if ((e = gshm__parse_size(s, out)))
      *why = e == -ERANGE ? "number too large"
                          : "not a size: a whole number of bytes, alone or with K, M, G or T (or "
                            "KB, KiB: all 1024-based)";
    return e ? -EINVAL : 0;
  }
  errno = 0;
  v = strtoull(s, &end, base);
  if (errno == ERANGE) {
    *why = "number too large";
    return -EINVAL;
  }
  if (*end) {
    *why = base == 8 ? "not an octal number" : "not a decimal number";
    return -EINVAL;
  }
  *out = (uint64_t)v;
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

/* STR, PATH and ENUM: checks the length, form or choice, stores a copy. */
static int option_set_string(void *field, const struct option_def *opt, const char *value,
                             const char **why, char *whybuf, size_t whybuf_size) {
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
    snprintf(whybuf, whybuf_size, "longer than %" PRIu64 " bytes%s", opt->max,
             opt->type == OPT_PATH && !strcmp(opt->key, "socket")
                 ? ", what a Unix socket's address holds: give a shorter path" : "");
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

/* U32, SIZE32, SIZE, MODE and a numeric LOGLEVEL: parses, checks the
 * range, stores in the field's width. */
static int option_set_number(void *field, const struct option_def *opt, const char *value,
                             const char **why, char *whybuf, size_t whybuf_size) {
  uint64_t n = 0;
  int r = parse_number(value, opt->type == OPT_SIZE || opt->type == OPT_SIZE32,
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

/* config_internal.h */
int gshmd__config_option_set(struct gshmd_config *cfg, const struct option_def *opt,
                             const char *value, const char **why, char *whybuf,
                             size_t whybuf_size) {
  void *field = (char *)cfg + opt->offset;
  bool b;

  switch (opt->type) {
  case OPT_STR:
  case OPT_PATH:
  case OPT_ENUM:
    return option_set_string(field, opt, value, why, whybuf, whybuf_size);
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
    return option_set_number(field, opt, value, why, whybuf, whybuf_size);
  }
  *why = "internal error: unknown option type";
  return -EINVAL;
}

/* Sets "section.key" to value, printing any error once with its origin. */
static int option_set_by_name(struct gshmd_config *cfg, const char *section, const char *key,
                              const char *value, const struct origin *where) {
  const struct option_def *opt = gshmd__config_option_find(section, key);
  char whybuf[160];
  const char *why = NULL;
  char at[PATH_MAX + 32];
  int r;

  if (where->line > 0)
    snprintf(at, sizeof(at), "%s:%d", where->file, where->line);
  else
    snprintf(at, sizeof(at), "%s", where->file);
  if (!opt) {
    if (gshmd__config_retired_key(at, section, key))
      return 0;
    char hint[160];

    gshmd__config_unknown_hint(section, key, hint, sizeof(hint));
    gshmd__config_error("%s: unknown key '%s.%s'%s", at, section, key, hint);
    return -EINVAL;
  }
  r = gshmd__config_option_set(cfg, opt, value, &why, whybuf, sizeof(whybuf));
  if (r < 0)
    gshmd__config_error("%s: key '%s.%s': %s", at, section, key, why);
  return r;
}

/* ---- public ------------------------------------------------------------- */

int gshmd_config_init(struct gshmd_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    char whybuf[160];
    const char *why = NULL;
    int r = gshmd__config_option_set(cfg, &gshmd__config_options[i], gshmd__config_options[i].def, &why, whybuf, sizeof(whybuf));

    if (r < 0) {
      if (r != -ENOMEM) /* a bad default is a bug in option_table.h */
        gshmd__config_error("built-in default of '%s.%s': %s", gshmd__config_options[i].section, gshmd__config_options[i].key, why);
      gshmd_config_free(cfg);
      return r;
    }
  }
  cfg->memory_uid = (uint32_t)geteuid(); /* (main.c: daemon.user's once resolved) */
  /* poll_us's default holds where gshmd can poll without taking the CPU
   * its clients need; a value from a file or --set applies everywhere. */
  if (gshm__usable_cpus() < GSHM_POLL_MIN_CPUS)
    cfg->poll_us = 0;
  return 0;
}

void gshmd_config_free(struct gshmd_config *cfg) {
  if (!cfg)
    return;
  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *opt = &gshmd__config_options[i];

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
      gshmd__config_error("--set %s: expected SECTION.KEY=VALUE", ov->arg);
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

/* What the command line asked for besides configuration keys. */
struct cmdline {
  const char *config_path;    /* --config, or NULL for the default */
  bool check, dump;           /* --check-config, --dump-config */
  int info;                   /* FLAG_HELP, FLAG_VERSION or FLAG_PRINT: the first given */
  bool answered;              /* --help, --version or --print-config was printed */
  struct override *overrides; /* flags that set keys, in argv order; freed by the caller */
  size_t n_overrides;
};

/* Prints what --help, --version or --print-config (cl->info, the first of
 * them given) asks for, and sets cl->answered; nothing without one. */
static void cmdline_answer(struct cmdline *cl) {
  if (cl->info == FLAG_PRINT)
    gshmd__config_print_default(stdout);
  else if (cl->info == FLAG_HELP)
    gshmd__config_print_usage(stdout);
  else if (cl->info == FLAG_VERSION)
    printf("gshmd " GSHM_VERSION "\n");
  cl->answered = cl->info != 0;
}

/* Parses argv into cl.  --help, --version and --print-config print once
 * all of argv parsed (cl->answered): an unknown option or a missing value
 * after them ("gshmd -V --bogus") is a usage error, not an answer that
 * leaves it unsaid.  Returns 0, -EINVAL for a bad command line (said on
 * stderr) or -ENOMEM. */
static int cmdline_parse(struct cmdline *cl, int argc, char **argv) {
  struct option longopts[gshmd__config_nflags + 1];
  int c;

  for (size_t i = 0; i < gshmd__config_nflags; i++)
    longopts[i] = (struct option){gshmd__config_flags[i].name, gshmd__config_flags[i].has_arg,
                                  NULL, gshmd__config_flags[i].val};
  longopts[gshmd__config_nflags] = (struct option){0};

  cl->overrides = calloc(argc > 0 ? (size_t)argc : 1, sizeof(*cl->overrides));
  if (!cl->overrides) {
    gshmd__config_error("out of memory");
    return -ENOMEM;
  }

  opterr = 0; /* our own messages, prefixed "gshmd:" */
  optind = 0; /* full getopt reset, so that setup may run more than once */
  while ((c = getopt_long(argc, argv, ":c:s:hV", longopts, NULL)) != -1) {
    switch (c) {
    case FLAG_CONFIG:
      cl->config_path = optarg;
      break;
    case FLAG_SOCKET:
    case FLAG_BACKEND:
    case FLAG_LOG_LEVEL:
    case FLAG_LEGACY_IPC:
    case FLAG_SET:
      cl->overrides[cl->n_overrides++] = (struct override){c, optarg};
      break;
    case FLAG_CHECK:
      cl->check = true;
      break;
    case FLAG_DUMP:
      cl->dump = true;
      break;
    case FLAG_PRINT:
    case FLAG_HELP:
    case FLAG_VERSION:
      cl->info = cl->info ? cl->info : c;
      break;
    case ':':
      gshmd__config_error("option '%s' requires an argument", argv[optind - 1]);
      usage_hint();
      return -EINVAL;
    default:
      if (optopt && optopt < 256)
        gshmd__config_error("invalid option '-%c'", optopt);
      else
        gshmd__config_error("unrecognized option '%s'", argv[optind - 1]);
      usage_hint();
      return -EINVAL;
    }
  }
  if (optind < argc) {
    gshmd__config_error("unexpected argument '%s'", argv[optind]);
    usage_hint();
    return -EINVAL;
  }
  cmdline_answer(cl);
  return 0;
}

/* Reads the sources in rising precedence: the file, its drop-ins,
 * $GSHM_SOCKET, then the flags in argv order.  The default file may be
 * missing; one named with --config may not. */
static int config_load_all(struct gshmd_config *cfg, const struct cmdline *cl) {
  const char *path = cl->config_path ? cl->config_path : GSHMD_DEFAULT_CONFIG;
  const char *env = getenv("GSHM_SOCKET");
  char *file_socket = NULL;
  int r;

  r = gshmd__config_load_file(cfg, path, !cl->config_path);
  if (r < 0 && !(r == -ENOENT && !cl->config_path))
    return r;
  snprintf(cfg->sources, sizeof(cfg->sources), r < 0 ? "%s is missing: the built-in defaults"
           : "read %s", path);
  r = gshmd__config_load_dropins(cfg, path);
  if (r < 0)
    return r;
  if (r > 0)
    snprintf(cfg->sources + strlen(cfg->sources), sizeof(cfg->sources) - strlen(cfg->sources),
             " and %d drop-in%s from its conf.d", r, r == 1 ? "" : "s");
  if (env && env[0]) {
    struct origin where = {.file = "$GSHM_SOCKET"};
    /* the files' own socket, lost to the environment: said below */
    if (strcmp(cfg->socket_path, env) && strcmp(cfg->socket_path, GSHMD_DEFAULT_SOCKET) &&
        !(file_socket = strdup(cfg->socket_path)))
      return -ENOMEM;
    r = option_set_by_name(cfg, "daemon", "socket", env, &where);
  }
  for (size_t i = 0; r >= 0 && i < cl->n_overrides; i++)
    r = override_apply(cfg, &cl->overrides[i]);
  /* A shell that exported one gshmd's socket for gshmctl starts a second
   * gshmd on that path, whatever its file says (docs/CLUSTER.md, two nodes
   * on one host): "another gshmd is already listening" was all it said. */
  if (r >= 0 && file_socket && !strcmp(cfg->socket_path, env))
    gshmd__config_warning("$GSHM_SOCKET (%s) overrides daemon.socket = %s of the configuration "
                          "files; unset GSHM_SOCKET for this gshmd, or give --socket PATH",
                          env, file_socket);
  free(file_socket);
  return r < 0 ? r : 0;
}

/* Values whose form the option table cannot express: checked here so that
 * --check-config finds what would stop gshmd later.  The admin group
 * is looked up here only under --check-config (check): at start the server
 * looks it up itself (gshmd_server_start) and refuses to start without it. */
static int config_validate(const struct gshmd_config *cfg, bool check) {
  if (cfg->metrics_http_listen && *cfg->metrics_http_listen) {
    struct sockaddr_storage sa;
    socklen_t salen;
    if (gshm__parse_loopback(cfg->metrics_http_listen, &sa, &salen)) {
      gshmd__config_error("metrics.http_listen '%s': want a loopback ADDRESS:PORT such as "
                          "127.0.0.1:9477",
                          cfg->metrics_http_listen);
      return -EINVAL;
    }
  }
  /* One list item must fit in one reply: the largest is a lease (segment
   * name, client name, location, 8 device UUIDs and a dozen numbers:
   * under 1 KiB besides the name), within max_packet less the header and
   * the reply's own fields (proto/wire.h gshm__wire_list_budget). */
  if ((uint64_t)cfg->max_name + GSHMD_LIST_ITEM_OVERHEAD > (uint64_t)cfg->max_packet - 16 - 64) {
    gshmd__config_error("limits.max_name %u: a list item with a name that long does not fit in "
                        "one reply of limits.max_packet %u bytes (names up to %u fit)",
                        cfg->max_name, cfg->max_packet,
                        cfg->max_packet - 16 - 64 - GSHMD_LIST_ITEM_OVERHEAD);
    return -EINVAL;
  }
  if (check && cfg->user && *cfg->user) {
    struct gshmd_user u;
    int e = gshmd_user_resolve(cfg->user, &u, true);
    if (e == -ENOENT) { /* (not -EPERM: a user checks the file gshmd.service's root reads) */
      gshmd__config_error("daemon.user '%s': no such user", cfg->user);
      return -EINVAL;
    }
  }
  if (check && cfg->admin_group && *cfg->admin_group && !getgrnam(cfg->admin_group)) {
    gshmd__config_error("daemon.admin_group '%s': no such group", cfg->admin_group);
    return -EINVAL;
  }
  /* (gshmd does not start with it either: main.c socket_set_owner) */
  if (check && cfg->socket_group && *cfg->socket_group && !getgrnam(cfg->socket_group)) {
    gshmd__config_error("daemon.socket_group '%s': no such group", cfg->socket_group);
    return -EINVAL;
  }
  return 0;
}

int gshmd_config_setup(struct gshmd_config *cfg, int argc, char **argv,
                       enum gshmd_config_action *action_out) {
  struct cmdline cl = {0};
  int r = cmdline_parse(&cl, argc, argv);
  bool check = false;

  if (r == 0 && !cl.answered)
    r = config_load_all(cfg, &cl);
  if (r == 0 && !cl.answered)
    r = config_validate(cfg, cl.check);
  if (r == 0 && !cl.answered) {
    if (cl.dump)
      gshmd__config_print_effective(stdout, cfg);
    /* --check-config: the caller checks what other layers read (the
     * cluster's keys) and says "configuration ok" */
    check = cl.check;
    cl.answered = cl.dump && !cl.check;
  }
  free(cl.overrides);
  if (r < 0)
    return r;
  /* "gshmd --dump-config > gshmd.conf" on a full disk: a cut file, not
   * exit 0 */
  if ((cl.answered || check) && (r = gshm__stdout_flush())) {
    gshmd__config_error("writing to stdout: %s", strerror(-r));
    return -EIO;
  }
  *action_out = check         ? GSHMD_CONFIG_CHECK
                : cl.answered ? GSHMD_CONFIG_EXIT_OK
                              : GSHMD_CONFIG_RUN;
  return 0;
}
