/* SPDX-License-Identifier: Apache-2.0 */
/* The relayed segments (relay.c) by name: a grant request by name finds
 * the segment in flight that stands for it without walking every item of
 * every pull in flight.  A tree (glibc's tsearch, as the registry's names)
 * of one entry per name; entries of the same name (sets in flight that
 * will publish it) chained in their sets' start order. */
#ifndef GSHMD_CLUSTER_RELAY_NAMES_H
#define GSHMD_CLUSTER_RELAY_NAMES_H

#include <stdint.h>

/* One relayed segment's entry, in its struct relay. */
struct relay_name {
  const char *name;          /* (first: the tree's key) the segment's; not owned */
  uint64_t order;            /* its set's start order (pull_set.seq): lower first */
  struct relay_name *same;   /* the next entry of this name, order not lower */
};

/* Adds e (name and order set) to the index at *root, after the entries
 * of its name whose order is not higher.  Returns 0, or -ENOMEM (e not
 * added). */
int gshmd__relay_names_add(void **root, struct relay_name *e);

/* Removes e, added before, from the index at *root. */
void gshmd__relay_names_remove(void **root, struct relay_name *e);

/* The entries named name, lowest order first (->same), or NULL. */
struct relay_name *gshmd__relay_names_get(void *const *root, const char *name);

#endif
