/* SPDX-License-Identifier: Apache-2.0 */
/* The path of relayed bytes (relay_path.h). */
#include "relay_path.h"

#include <stddef.h>
#include <string.h>

/* The length of the element of a path that starts at q (up to its comma
 * or end). */
static size_t element(const char *q) {
  const char *comma = strchr(q, ',');
  return comma ? (size_t)(comma - q) : strlen(q);
}

static bool name_ok(const char *q, size_t len) {
  if (len == 0 || len > 63)
    return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)q[i] <= 0x20 || q[i] == 0x7f)
      return false;
  return true;
}

bool gshmd__relay_path_ok(const char *path, bool *known_out) {
  unsigned names = 0;
  const char *q = path;

  *known_out = true;
  if (strlen(path) >= RELAY_PATH_LEN)
    return false;
  while (*q) {
    size_t len = element(q);
    if (len == 1 && *q == '?') {
      *known_out = false;
      return q[1] == 0; /* ("?" only last) */
    }
    if (!name_ok(q, len) || ++names > RELAY_PATH_MAX)
      return false;
    q += len;
    if (*q == ',' && !*++q)
      return false; /* (a trailing comma) */
  }
  return true;
}

bool gshmd__relay_path_has(const char *path, const char *name) {
  size_t n = strlen(name);

  for (const char *q = path; *q;) {
    size_t len = element(q);
    if (len == n && !strncmp(q, name, n) && strcmp(name, "?"))
      return true;
    q += len;
    q += *q == ',';
  }
  return false;
}

unsigned gshmd__relay_path_names(const char *path) {
  unsigned n = 0;

  for (const char *q = path; *q;) {
    size_t len = element(q);
    n += !(len == 1 && *q == '?');
    q += len;
    q += *q == ',';
  }
  return n;
}
