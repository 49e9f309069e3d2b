/* SPDX-License-Identifier: Apache-2.0 */
/* The Prometheus text format parser of prometheus.h. */
#include "prometheus.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void expo_free(struct exposition *x) {
  for (size_t i = 0; i < x->ns; i++) {
    free(x->s[i].name);
    free(x->s[i].labels);
  }
  for (size_t i = 0; i < x->nf; i++)
    free(x->f[i].name);
  free(x->s);
  free(x->f);
  memset(x, 0, sizeof(*x));
}

static int parse_error(struct exposition *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int parse_error(struct exposition *x, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(x->err, sizeof(x->err), "line %d: ", x->line);
  va_start(ap, fmt);
  vsnprintf(x->err + n, sizeof(x->err) - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

static bool metric_name_ok(const char *s, size_t n) {
  if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
      return false;
  return true;
}

static bool label_name_ok(const char *s, size_t n) {
  if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
    return false;
  if (n >= 2 && s[0] == '_' && s[1] == '_')
    return false; /* reserved */
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
      return false;
  return true;
}

/* Go's strconv.ParseFloat as the text format uses it: decimal or
 * exponent notation, NaN, +Inf, -Inf (and Inf).  No hex, no blanks. */
static bool parse_value(const char *s, double *out) {
  char *end;
  if (!strcmp(s, "NaN")) {
    *out = NAN;
    return true;
  }
  if (!strcmp(s, "+Inf") || !strcmp(s, "Inf")) {
    *out = INFINITY;
    return true;
  }
  if (!strcmp(s, "-Inf")) {
    *out = -INFINITY;
    return true;
  }
  for (const char *p = s; *p; p++)
    if (!(isdigit((unsigned char)*p) || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' ||
          *p == '-'))
      return false;
  errno = 0;
  *out = strtod(s, &end);
  return *s && !*end && errno == 0;
}

static struct family *family_find(struct exposition *x, const char *name) {
  for (size_t i = 0; i < x->nf; i++)
    if (!strcmp(x->f[i].name, name))
      return &x->f[i];
  return NULL;
}

static struct family *family_add(struct exposition *x, const char *name) {
  struct family *f;
  if (x->nf == x->capf) {
    x->capf = x->capf ? x->capf * 2 : 32;
    x->f = realloc(x->f, x->capf * sizeof(*x->f));
  }
  /* Starting a family closes every other one: a family's lines stay
   * together. */
  for (size_t i = 0; i < x->nf; i++)
    x->f[i].closed = true;
  f = &x->f[x->nf++];
  memset(f, 0, sizeof(*f));
  f->name = strdup(name);
  return f;
}

/* The family a sample belongs to: histogram/summary suffixes map to their
 * base name when that base has such a TYPE. */
static const char *family_of(struct exposition *x, const char *name, char *buf, size_t cap) {
  static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
  size_t n = strlen(name);
  for (size_t i = 0; i < 3; i++) {
    size_t k = strlen(suffixes[i]);
    struct family *f;
    if (n > k && !strcmp(name + n - k, suffixes[i]) && n - k < cap) {
      memcpy(buf, name, n - k);
      buf[n - k] = '\0';
      f = family_find(x, buf);
      if (f && (!strcmp(f->type, "histogram") ||
                (!strcmp(f->type, "summary") && strcmp(suffixes[i], "_bucket"))))
        return buf;
    }
  }
  return name;
}

struct label {
  char name[128];
  char value[512];
};

static int cmp_label(const void *a, const void *b) {
  return strcmp(((const struct label *)a)->name, ((const struct label *)b)->name);
}

/* Parses `{a="x",b="y"}` at *pp; canonical form into out. */
static int parse_labels(struct exposition *x, const char **pp, struct label *ls, int *nl,
                        char *out, size_t cap) {
  const char *p = *pp + 1;
  size_t used = 0;
  *nl = 0;
  out[0] = '\0';
  for (;;) {
    const char *start = p;
    size_t vn = 0;
    if (*p == '}')
      break;
    while (isalnum((unsigned char)*p) || *p == '_')
      p++;
    if (!label_name_ok(start, (size_t)(p - start)) || (size_t)(p - start) >= sizeof(ls[0].name))
      return parse_error(x, "bad label name '%.*s'", (int)(p - start), start);
    if (*nl >= 32)
      return parse_error(x, "too many labels");
    memcpy(ls[*nl].name, start, (size_t)(p - start));
    ls[*nl].name[p - start] = '\0';
    if (p[0] != '=' || p[1] != '"')
      return parse_error(x, "label %s: expected =\"", ls[*nl].name);
    p += 2;
    while (*p != '"') {
      char ch = *p;
      if (!ch || ch == '\n')
        return parse_error(x, "unterminated label value");
      if (ch == '\\') {
        p++;
        if (*p == 'n')
          ch = '\n';
        else if (*p == '\\' || *p == '"')
          ch = *p;
        else
          return parse_error(x, "bad escape \\%c in label value", *p ? *p : '0');
      }
      if (vn + 1 >= sizeof(ls[0].value))
        return parse_error(x, "label value too long");
      ls[*nl].value[vn++] = ch;
      p++;
    }
    ls[*nl].value[vn] = '\0';
    p++;
    for (int i = 0; i < *nl; i++)
      if (!strcmp(ls[i].name, ls[*nl].name))
        return parse_error(x, "label %s given twice", ls[i].name);
    (*nl)++;
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p != '}')
      return parse_error(x, "expected , or } after a label");
  }
  qsort(ls, (size_t)*nl, sizeof(*ls), cmp_label);
  for (int i = 0; i < *nl; i++) {
    int w = snprintf(out + used, cap - used, "%s%s=%s", i ? "," : "", ls[i].name, ls[i].value);
    if (w < 0 || (size_t)w >= cap - used)
      return parse_error(x, "labels too long");
    used += (size_t)w;
  }
  *pp = p + 1;
  return 0;
}

static int parse_sample(struct exposition *x, const char *line) {
  const char *p = line, *start = line;
  char name[256], fam[256], labels[4096], value[64];
  struct label ls[32];
  struct family *f;
  struct sample *s;
  int nl = 0;
  size_t k;

  while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
    p++;
  if (!metric_name_ok(start, (size_t)(p - start)) || (size_t)(p - start) >= sizeof(name))
    return parse_error(x, "bad metric name in '%s'", line);
  memcpy(name, start, (size_t)(p - start));
  name[p - start] = '\0';
  labels[0] = '\0';
  if (*p == '{' && parse_labels(x, &p, ls, &nl, labels, sizeof(labels)))
    return -1;
  if (*p != ' ')
    return parse_error(x, "expected one space before the value in '%s'", line);
  p++;
  k = strcspn(p, " ");
  if (!k || k >= sizeof(value))
    return parse_error(x, "missing or long value in '%s'", line);
  memcpy(value, p, k);
  value[k] = '\0';
  p += k;
  if (*p == ' ') { /* optional timestamp: an integer of milliseconds */
    p++;
    if (*p == '-')
      p++;
    if (!isdigit((unsigned char)*p))
      return parse_error(x, "bad timestamp in '%s'", line);
    while (isdigit((unsigned char)*p))
      p++;
  }
  if (*p)
    return parse_error(x, "trailing text in '%s'", line);

  f = family_find(x, family_of(x, name, fam, sizeof(fam)));
  if (!f)
    return parse_error(x, "sample %s comes before its HELP/TYPE lines", name);
  if (f->closed)
    return parse_error(x, "samples of %s are not together", f->name);
  if (!f->help || !*f->type)
    return parse_error(x, "%s lacks a %s line", f->name, f->help ? "TYPE" : "HELP");
  if (x->ns == x->caps) {
    x->caps = x->caps ? x->caps * 2 : 64;
    x->s = realloc(x->s, x->caps * sizeof(*x->s));
  }
  s = &x->s[x->ns];
  if (!parse_value(value, &s->value))
    return parse_error(x, "bad value '%s'", value);
  for (size_t i = 0; i < x->ns; i++)
    if (!strcmp(x->s[i].name, name) && !strcmp(x->s[i].labels, labels))
      return parse_error(x, "duplicate series %s{%s}", name, labels);
  if (!strcmp(f->type, "counter")) {
    if (strlen(f->name) < 6 || strcmp(f->name + strlen(f->name) - 6, "_total"))
      return parse_error(x, "counter %s does not end in _total", f->name);
    if (!(s->value >= 0))
      return parse_error(x, "counter %s is negative or NaN", name);
  }
  for (int i = 0; i < nl; i++) {
    if (!strcmp(ls[i].name, "le") && strcmp(f->type, "histogram"))
      return parse_error(x, "label le on %s, which is not a histogram", name);
    if (!strcmp(ls[i].name, "quantile") && strcmp(f->type, "summary"))
      return parse_error(x, "label quantile on %s, which is not a summary", name);
  }
  if (!strcmp(f->type, "histogram")) {
    bool bucket = strlen(name) > strlen(f->name) && !strcmp(name + strlen(f->name), "_bucket");
    bool has_le = false;
    for (int i = 0; i < nl; i++)
      has_le |= !strcmp(ls[i].name, "le");
    if (!strcmp(name, f->name))
      return parse_error(x, "histogram %s has a bare sample", name);
    if (bucket != has_le)
      return parse_error(x, "%s: le belongs on _bucket samples only", name);
  }
  s->name = strdup(name);
  s->labels = strdup(labels);
  x->ns++;
  return 0;
}

/* Removes the le=... pair from a canonical label string. */
static void labels_without_le(const char *in, char *out, size_t cap, double *le) {
  const char *p = in;
  size_t used = 0;
  out[0] = '\0';
  *le = NAN;
  while (*p) {
    size_t k = strcspn(p, ",");
    if (!strncmp(p, "le=", 3)) {
      char v[64];
      snprintf(v, sizeof(v), "%.*s", (int)(k - 3), p + 3);
      if (!parse_value(v, le))
        *le = NAN;
    } else {
      used += (size_t)snprintf(out + used, cap - used, "%s%.*s", used ? "," : "", (int)k, p);
    }
    p += k + (p[k] == ',');
  }
}

/* Each histogram series (label set without le): buckets in increasing le
 * order with non-decreasing counts, a +Inf bucket equal to _count, a _sum
 * and a _count. */
static int check_histograms(struct exposition *x) {
  for (size_t fi = 0; fi < x->nf; fi++) {
    struct family *f = &x->f[fi];
    char bname[300], sname[300], cname[300];
    if (strcmp(f->type, "histogram"))
      continue;
    snprintf(bname, sizeof(bname), "%s_bucket", f->name);
    snprintf(sname, sizeof(sname), "%s_sum", f->name);
    snprintf(cname, sizeof(cname), "%s_count", f->name);
    for (size_t i = 0; i < x->ns; i++) {
      char base[4096], other[4096];
      double le, prev_le = -INFINITY, prev_count = 0, inf_count = NAN, count = NAN;
      bool have_sum = false, first = true;
      if (strcmp(x->s[i].name, bname))
        continue;
      labels_without_le(x->s[i].labels, base, sizeof(base), &le);
      /* Only the first bucket of each series starts a check. */
      for (size_t j = 0; j < i && first; j++)
        if (!strcmp(x->s[j].name, bname)) {
          labels_without_le(x->s[j].labels, other, sizeof(other), &le);
          first = strcmp(other, base) != 0;
        }
      if (!first)
        continue;
      for (size_t j = i; j < x->ns; j++) {
        if (!strcmp(x->s[j].name, bname)) {
          labels_without_le(x->s[j].labels, other, sizeof(other), &le);
          if (strcmp(other, base))
            continue;
          if (isnan(le))
            return parse_error(x, "%s{%s}: bad le", bname, x->s[j].labels);
          if (!(le > prev_le))
            return parse_error(x, "%s{%s}: le not increasing", bname, base);
          if (x->s[j].value < prev_count)
            return parse_error(x, "%s{%s}: bucket counts decrease at le=%g", bname, base, le);
          prev_le = le;
          prev_count = x->s[j].value;
          if (isinf(le))
            inf_count = x->s[j].value;
        } else if (!strcmp(x->s[j].labels, base) && !strcmp(x->s[j].name, sname)) {
          have_sum = true;
        } else if (!strcmp(x->s[j].labels, base) && !strcmp(x->s[j].name, cname)) {
          count = x->s[j].value;
        }
      }
      if (isnan(inf_count))
        return parse_error(x, "%s{%s}: no le=\"+Inf\" bucket", bname, base);
      if (isnan(count) || count != inf_count)
        return parse_error(x, "%s{%s}: _count %g differs from the +Inf bucket %g", f->name, base, count,
                    inf_count);
      if (!have_sum)
        return parse_error(x, "%s{%s}: no _sum", f->name, base);
    }
  }
  return 0;
}

int expo_parse(struct exposition *x, const char *text) {
  const char *p = text;
  memset(x, 0, sizeof(*x));
  if (!*text)
    return parse_error(x, "empty exposition");
  if (text[strlen(text) - 1] != '\n')
    return parse_error(x, "the last line does not end with a line feed (partial file?)");
  while (*p) {
    size_t len = strcspn(p, "\n");
    char *line = strndup(p, len);
    int r = 0;
    x->line++;
    if (len && (line[len - 1] == ' ' || line[len - 1] == '\r' || line[len - 1] == '\t'))
      r = parse_error(x, "trailing blank");
    else if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
      bool help = line[2] == 'H';
      const char *n = line + 7, *e = n + strcspn(n, " ");
      char name[256];
      struct family *f;
      if (!metric_name_ok(n, (size_t)(e - n)) || (size_t)(e - n) >= sizeof(name))
        r = parse_error(x, "bad metric name in '%s'", line);
      else {
        memcpy(name, n, (size_t)(e - n));
        name[e - n] = '\0';
        f = family_find(x, name);
        if (f && f->closed)
          r = parse_error(x, "%s: metadata after another family", name);
        else if (!f)
          f = family_add(x, name);
        if (!r && help) {
          if (f->help)
            r = parse_error(x, "second HELP for %s", name);
          else if (*e != ' ' || !e[1])
            r = parse_error(x, "empty HELP for %s", name);
          for (const char *q = e; !r && *q; q++)
            if (*q == '\\' && q[1] != 'n' && q[1] != '\\')
              r = parse_error(x, "bad escape in HELP of %s", name);
            else if (*q == '\\')
              q++;
          f->help = true;
        } else if (!r) {
          static const char *const types[] = {"counter", "gauge", "histogram", "summary",
                                              "untyped"};
          bool ok = false;
          for (size_t i = 0; *e == ' ' && i < 5; i++)
            ok |= !strcmp(e + 1, types[i]);
          if (*f->type)
            r = parse_error(x, "second TYPE for %s", name);
          else if (!ok)
            r = parse_error(x, "bad TYPE line '%s'", line);
          else {
            for (size_t i = 0; i < x->ns; i++) {
              char fam[256];
              if (!strcmp(family_of(x, x->s[i].name, fam, sizeof(fam)), name))
                r = parse_error(x, "TYPE of %s after its samples", name);
            }
            snprintf(f->type, sizeof(f->type), "%s", e + 1);
          }
        }
      }
    } else if (len && line[0] == '#') {
      /* a comment */
    } else if (len) {
      r = parse_sample(x, line);
    }
    free(line);
    if (r)
      return -1;
    p += len + (p[len] == '\n');
  }
  for (size_t i = 0; i < x->nf; i++) {
    bool any = false;
    char fam[256];
    for (size_t j = 0; j < x->ns && !any; j++)
      any = !strcmp(family_of(x, x->s[j].name, fam, sizeof(fam)), x->f[i].name);
    if (!any && strcmp(x->f[i].type, "histogram") && strcmp(x->f[i].type, "summary")) {
      x->line = 0;
      return parse_error(x, "family %s has metadata but no samples", x->f[i].name);
    }
  }
  x->line = 0;
  return check_histograms(x);
}

double expo_get(const struct exposition *x, const char *name, const char *labels) {
  for (size_t i = 0; i < x->ns; i++)
    if (!strcmp(x->s[i].name, name) && !strcmp(x->s[i].labels, labels ? labels : ""))
      return x->s[i].value;
  return NAN;
}

const char *expo_type(const struct exposition *x, const char *family) {
  for (size_t i = 0; i < x->nf; i++)
    if (!strcmp(x->f[i].name, family))
      return x->f[i].type;
  return NULL;
}
