/* SPDX-License-Identifier: Apache-2.0 */
/* What config.c (the option table, value parsing, flags, setup) shares with
 * config_file.c (INI files and conf.d drop-ins) and config_print.c (--help,
 * --print-config, --dump-config).  Nothing outside these three includes it. */
#ifndef GSHMD_CONFIG_INTERNAL_H
#define GSHMD_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

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

/* Command-line flags; the table also generates the flag part of --help.
 * Values under 256 are also the short option letter. */
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

/* The option table (option_table.h) and the flag table, in their order. */
extern const struct option_def gshmd__config_options[];
extern const size_t gshmd__config_noptions;
extern const struct flag_def gshmd__config_flags[];
extern const size_t gshmd__config_nflags;

/* Prints "gshmd: " and the message on stderr (with the <3> priority prefix
 * under journald).  Keeps errno for %m. */
__attribute__((format(printf, 1, 2))) void gshmd__config_error(const char *fmt, ...);

/* Prints "gshmd: warning: " and the message on stderr (with the <4>
 * priority prefix under journald): a setting that is taken, but likely
 * not what its writer meant. */
__attribute__((format(printf, 1, 2))) void gshmd__config_warning(const char *fmt, ...);

/* The row of section.key, or NULL when there is none. */
const struct option_def *gshmd__config_option_find(const char *section, const char *key);

/* What an error about the unknown key section.key ("" for a key before any
 * [section]) adds: the nearest key of the table, within a typo or two (or
 * the same key in another section), and where every key is listed; into
 * out (n bytes, cut to fit), starting with a blank. */
void gshmd__config_unknown_hint(const char *section, const char *key, char *out, size_t n);

/* If section.key is a key older releases read, warns once on stderr,
 * naming at (where it was set) and returns true: the caller ignores it. */
bool gshmd__config_retired_key(const char *at, const char *section, const char *key);

/* Validates value for opt and stores it into cfg (a string is copied).
 * Returns 0, -EINVAL with *why pointing at a static explanation or at
 * whybuf (filled), or -ENOMEM. */
int gshmd__config_option_set(struct gshmd_config *cfg, const struct option_def *opt,
                             const char *value, const char **why, char *whybuf,
                             size_t whybuf_size);

/* Whether section.name holds a list separated by blanks (cluster.peers,
 * cluster.export), which a line ending with '\\' continues on the next
 * (config_file.c) and --dump-config writes over several lines. */
bool gshmd__config_list_key(const char *section, const char *name);

/* Parses the INI file path into cfg, printing the first error with its
 * file and line.  Returns 0; -ENOENT for a missing file (not printed when
 * quiet_missing); -EINVAL for a syntax or value error; another negative
 * errno when the file cannot be read. */
int gshmd__config_load_file(struct gshmd_config *cfg, const char *path, bool quiet_missing);

/* Reads <directory of path>/conf.d/ *.conf in bytewise order, each with
 * gshmd__config_load_file; a missing conf.d is fine.  Stops at the first
 * error and returns it (negative errno), else the number of drop-ins read. */
int gshmd__config_load_dropins(struct gshmd_config *cfg, const char *path);

/* --help: the flags, the environment and every key with its default. */
void gshmd__config_print_usage(FILE *f);

/* --print-config: conf/gshmd.conf, every key commented out with its
 * default. */
void gshmd__config_print_default(FILE *f);

/* --dump-config: cfg as an INI file that parses back to the same values. */
void gshmd__config_print_effective(FILE *f, const struct gshmd_config *cfg);

#endif
