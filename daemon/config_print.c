/* SPDX-License-Identifier: Apache-2.0 */
/* gshmd's generated text: --help, --print-config (conf/gshmd.conf) and
 * --dump-config, all from the option and flag tables. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

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
      return "bytes; K/M/G/T (also KB, KiB) are 1024-based";
    snprintf(buf, size, "bytes %" PRIu64 "..%" PRIu64 "; K/M/G/T (also KB, KiB) are 1024-based",
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

void gshmd__config_print_usage(FILE *f) {
  char line[128];

  fprintf(f, "Usage: gshmd [OPTION]...\n"
             "Per-node daemon that shares GPU and host memory segments between processes.\n"
             "\n"
             "Options:\n");
  for (size_t i = 0; i < gshmd__config_nflags; i++) {
    const struct flag_def *fl = &gshmd__config_flags[i];
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
  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *opt = &gshmd__config_options[i];
    char tbuf[96];

    fprintf(f, "  %s.%s = %s  (%s)\n", opt->section, opt->key, opt->def[0] ? opt->def : "\"\"",
            option_type_doc(opt, tbuf, sizeof(tbuf)));
    print_wrapped(f, NULL, "      ", opt->help, 79);
  }
  fprintf(f, "\n"
             "Signals: SIGTERM or SIGINT stops gshmd.\n"
             "\n"
             "Exit status:\n"
             "  0   stopped by a signal; --help, --version, --print-config, --dump-config,\n"
             "      or --check-config found the configuration ok\n"
             "  1   gshmd could not start (its socket, a backend, the cluster port, a\n"
             "      --config file that is missing, ...): its log says why; or what\n"
             "      --help, --print-config, ... print could not be written\n"
             "  2   a usage or configuration error: an unknown option or key, a bad\n"
             "      value (the message names the file, line and key)\n"
             "  75  stopped for a restart after a sticky CUDA error, or once the GPUs\n"
             "      work again (gshmd.service's Restart=on-failure starts it again)\n"
             "\n"
             "See gshmd --print-config for a commented configuration file.\n");
}

/* The value of opt in cfg the way the INI parser reads it back: a
 * string option's own text (a list of peers may run past size), else
 * formatted into buf (size bytes). */
static const char *option_format(const struct gshmd_config *cfg, const struct option_def *opt,
                                 char *buf, size_t size) {
  const void *field = (const char *)cfg + opt->offset;

  switch (opt->type) {
  case OPT_STR:
  case OPT_PATH:
  case OPT_ENUM:
    return *(char *const *)field ? *(char *const *)field : "";
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
  return buf;
}

static void print_key_value(FILE *f, const char *prefix, const char *key, const char *value) {
  fprintf(f, "%s%s =%s%s\n", prefix, key, value[0] ? " " : "", value);
}

/* A list key's value over lines of at most about 100 bytes, each but the
 * last ending with '\\', broken at blanks (and at cluster.peers' commas),
 * so that it reads back under libinih's 197-byte lines. */
static void print_list_value(FILE *f, const struct option_def *opt, const char *value) {
  const char *breaks = strcmp(opt->key, "peers") ? " \t" : " \t,";
  size_t col = (size_t)fprintf(f, "%s =", opt->key);

  for (const char *p = value; *p;) {
    size_t n;
    p += strspn(p, breaks);
    if (!(n = strcspn(p, breaks)))
      break;
    if (col > 8 && col + 1 + n > 100) {
      fputs(" \\\n   ", f);
      col = 3;
    }
    col += (size_t)fprintf(f, " %.*s", (int)n, p);
    p += n;
  }
  fputc('\n', f);
}

/* Writes conf/gshmd.conf: every key commented out with its default. */
void gshmd__config_print_default(FILE *f) {
  const char *section = NULL;

  fputs("# gshmd configuration (INI).\n"
        "#\n"
        "# Every key is listed, commented out, with its built-in default. To change\n"
        "# one, uncomment it under its [section]. Files in conf.d/*.conf next to this\n"
        "# file are read after it in lexical order and override it; the environment\n"
        "# ($GSHM_SOCKET) and command-line flags override both. Unknown keys and bad\n"
        "# values are errors; a key set twice in one file warns, and its last value\n"
        "# wins. Check with: gshmd --check-config\n"
        "#\n"
        "# A comment starts a line or follows a value after a blank (\"key = v  # why\").\n"
        "# Lines are at most 197 bytes (libinih's buffer); set a longer value, such\n"
        "# as a deep textfile path, with --set SECTION.KEY=VALUE. A line of\n"
        "# cluster.peers or cluster.export that ends with '\\' continues on the next.\n"
        "#\n"
        "# Generated by gshmd --print-config from the daemon's option table.\n",
        f);
  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *opt = &gshmd__config_options[i];
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
void gshmd__config_print_effective(FILE *f, const struct gshmd_config *cfg) {
  const char *section = NULL;
  char buf[64];

  for (size_t i = 0; i < gshmd__config_noptions; i++) {
    const struct option_def *opt = &gshmd__config_options[i];
    const char *value;

    if (!section || strcmp(section, opt->section) != 0) {
      fprintf(f, "%s[%s]\n", section ? "\n" : "", opt->section);
      section = opt->section;
    }
    value = option_format(cfg, opt, buf, sizeof(buf));
    if (gshmd__config_list_key(opt->section, opt->key))
      print_list_value(f, opt, value);
    else
      print_key_value(f, "", opt->key, value);
  }
}
