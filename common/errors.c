/* SPDX-License-Identifier: Apache-2.0 */
#include "errors.h"

#include <errno.h>

const char *gshm__strerror(int err) {
  if (err < 0)
    err = -err;
  switch (err) {
  case 0:
    return "success";
#define GSHM_ERR_MSG(e, msg) \
  case e:                    \
    return msg;
    GSHM_ERRNO_MAP(GSHM_ERR_MSG)
#undef GSHM_ERR_MSG
  default:
    return "unknown error";
  }
}

const char *gshm__errname(int err) {
  if (err < 0)
    err = -err;
  switch (err) {
#define GSHM_ERR_NAME(e, msg) \
  case e:                     \
    return #e;
    GSHM_ERRNO_MAP(GSHM_ERR_NAME)
#undef GSHM_ERR_NAME
  default:
    return "E?";
  }
}
