/* Staging device segments through pinned host memory (docs/CLUSTER.md
 * "Device memory"). */
#include "stage.h"

#include <errno.h>
#include <stdlib.h>

#include "registry.h"

int gshmd_stage_serve_buf(struct gshmd_cluster *cl, struct link *l, struct stage_buf **sb_out) {
  (void)cl;
  (void)l;
  (void)sb_out;
  return -ENOTSUP;
}

int gshmd_stage_serve(struct gshmd_cluster *cl, struct link *l, uint32_t rid,
                      struct gshmd_segment *seg, const Gshm__Cluster__Stage *s) {
  (void)cl;
  (void)l;
  (void)rid;
  (void)seg;
  (void)s;
  return -ENOTSUP;
}

void gshmd_stage_free(struct gshmd_cluster *cl, struct stage_buf *sb) {
  if (!sb)
    return;
  if (sb->rkey)
    ucp_rkey_buffer_release(sb->rkey);
  if (sb->memh)
    ucp_mem_unmap(cl->ctx, sb->memh);
  free(sb);
}

void gshmd_stage_destroy(struct gshmd_cluster *cl) { (void)cl; }
