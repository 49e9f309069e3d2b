/* SPDX-License-Identifier: Apache-2.0 */
/* The relayed segments by name (relay_names.h). */
#include "relay_names.h"

#include <errno.h>
#include <search.h>
#include <string.h>

/* (a and b point at a struct relay_name, or at a name to look up: both
 * begin with the name's pointer) */
static int name_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int gshmd__relay_names_add(void **root, struct relay_name *e) {
  struct relay_name **at = tsearch(e, root, name_cmp), **pp;

  if (!at)
    return -ENOMEM;
  if (*at == e) { /* the first of its name */
    e->same = NULL;
    return 0;
  }
  for (pp = at; *pp && (*pp)->order <= e->order; pp = &(*pp)->same)
    ;
  e->same = *pp;
  *pp = e; /* (at the head: the node's key is e now, of the same name) */
  return 0;
}

void gshmd__relay_names_remove(void **root, struct relay_name *e) {
  struct relay_name **at = tfind(e, root, name_cmp), **pp;

  if (!at)
    return;
  if (*at == e && !e->same) {
    tdelete(e, root, name_cmp);
    return;
  }
  for (pp = at; *pp && *pp != e; pp = &(*pp)->same)
    ;
  if (*pp)
    *pp = e->same;
}

struct relay_name *gshmd__relay_names_get(void *const *root, const char *name) {
  struct relay_name **at = tfind(&name, root, name_cmp);
  return at ? *at : NULL;
}
