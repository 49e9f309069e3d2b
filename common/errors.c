/* SPDX-License-Identifier: Apache-2.0 */
#include "errors.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

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

enum gshm_pull_failure gshm__pull_failure(int err) {
  switch (err < 0 ? -err : err) {
  case ECONNRESET: case ETIMEDOUT: case ESHUTDOWN: return GSHM_PULL_FAIL_PEER_LOST;
  case ENOENT: return GSHM_PULL_FAIL_NOT_FOUND;
  case EACCES: case EPERM: return GSHM_PULL_FAIL_REFUSED;
  case EEXIST: return GSHM_PULL_FAIL_EXISTS;
  case ECANCELED: return GSHM_PULL_FAIL_CANCELED;
  case ENOMEM: case EDQUOT: return GSHM_PULL_FAIL_NO_MEMORY;
  case EPROTO: case EPROTONOSUPPORT: return GSHM_PULL_FAIL_PROTOCOL;
  default: return GSHM_PULL_FAIL_OTHER;
  }
}

#define GSHM_PULL_FAILURE_LABEL(name, label, text) [GSHM_PULL_FAIL_##name] = label,
#define GSHM_PULL_FAILURE_TEXT(name, label, text) [GSHM_PULL_FAIL_##name] = text,
static const char *const pull_failure_labels[GSHM_PULL_FAIL_N] = {
    GSHM_PULL_FAILURE_MAP(GSHM_PULL_FAILURE_LABEL)};
static const char *const pull_failure_texts[GSHM_PULL_FAIL_N] = {
    GSHM_PULL_FAILURE_MAP(GSHM_PULL_FAILURE_TEXT)};
#undef GSHM_PULL_FAILURE_LABEL
#undef GSHM_PULL_FAILURE_TEXT

const char *gshm__pull_failure_label(enum gshm_pull_failure f) {
  return (unsigned)f < GSHM_PULL_FAIL_N ? pull_failure_labels[f] : "other";
}

const char *gshm__peer_failure_text(int err) {
  const char *cause = pull_failure_texts[gshm__pull_failure(err)];
  return cause ? cause : gshm__strerror(err);
}

char *gshm__pull_what(char *buf, size_t len, bool prefix, const char *name) {
  if (prefix && !*name)
    snprintf(buf, len, "every segment");
  else
    snprintf(buf, len, "%s'%s'", prefix ? "the set under " : "", name);
  return buf;
}

char *gshm__pull_failure_message(char *buf, size_t len, bool prefix, const char *name,
                                 const char *peer, int err, const char *why) {
  char what[GSHM__PULL_WHAT_CAP];
  bool has_why = why && *why;

  snprintf(buf, len, "pull of %s from peer%s '%s' failed: %s%s%s",
           gshm__pull_what(what, sizeof(what), prefix, name), strchr(peer, ',') ? "s" : "", peer,
           gshm__peer_failure_text(err), has_why ? ": " : "", has_why ? why : "");
  return buf;
}
