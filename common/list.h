/* SPDX-License-Identifier: Apache-2.0 */
/* Intrusive circular doubly-linked list (the shape of libuv's queue.h and
 * the Linux kernel's list.h): O(1) insert and remove with no allocation. */
#ifndef GSHM_COMMON_LIST_H
#define GSHM_COMMON_LIST_H

#include <stddef.h>

struct gshm_list {
  struct gshm_list *next, *prev;
};

#define GSHM_LIST_INIT(name) {&(name), &(name)}
#define gshm_list_entry(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define gshm_list_foreach(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)
#define gshm_list_foreach_safe(pos, tmp, head) \
  for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); (pos) = (tmp), (tmp) = (pos)->next)

static inline void gshm_list_init(struct gshm_list *h) { h->next = h->prev = h; }
static inline int gshm_list_empty(const struct gshm_list *h) { return h->next == h; }

static inline void gshm_list_add_tail(struct gshm_list *h, struct gshm_list *n) {
  n->prev = h->prev;
  n->next = h;
  h->prev->next = n;
  h->prev = n;
}

static inline void gshm_list_del(struct gshm_list *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->next = n->prev = n;
}

#endif
