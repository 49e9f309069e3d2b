#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# The code names a document gives in backquotes (`gshmd__relay_landed`,
# `GSHM_ERRNO_MAP`, `take_no_driver()`: one word with an underscore) are
# words of a tracked file that is not Markdown, so that a renamed or
# removed function, macro, field or test leaves no stale name in the docs
# (docs/ARCHITECTURE.md named pull.c's `grant_is_listed` long after it
# became sources.c's gshmd__pull_grant_is_listed).  Not checked:
#   - a name the text gives as another project's ("UCX's
#     `UCT_CUDADRV_FUNC`", libuv's), or one in the list of names that are
#     not gshm's below (each must still be named by some checked doc);
#   - an abbreviation that starts with '_' (`_open` after
#     `gshmd_registry_create`);
# and these count as found:
#   - a ctest name made by a foreach (`unit_test_log`, `integration_X`,
#     `valgrind_X`): the word after the prefix is the test's;
#   - a prefix ending in `_*` (`auto_sm_max_*`): some word starts with it.
# docs/PERFORMANCE.md is checked only down to the first benchmark section:
# its head (current figures, the AUTO thresholds the code uses) describes
# today's code, while the benchmark sections are records of past runs that
# name the code of their commit (`gshmd_fdstore_sync`) and perf's kernel
# symbols on purpose.  ctest runs it on README.md, docs/*.md and python/README.md as the
# test `docs_names`.
#
#   scripts/doc-names-check.sh [FILE.md...]   lists the names no file has;
#                                             exit 1 if any
set -euo pipefail

cd "$(dirname "$0")/.."
all=0
(($#)) || { all=1; set -- README.md docs/*.md python/README.md; }

# Names that are not gshm's, each with its owner.  Keep it short: a name of
# gshm's own that no file has is a stale name to fix in the doc.
foreign=(
  UCX_NET_DEVICES    # UCX's environment (docs/CLUSTER.md)
  ucp_request_cancel # UCX's (docs/CLUSTER.md, docs/SECURITY.md)
  CAP_SYS_PTRACE     # the kernel's capability (docs/CONTAINERS.md)
  pidfd_getfd        # the kernel's system call (docs/CONTAINERS.md)
  container_t        # SELinux's container type (docs/CONTAINERS.md)
)

words=$(mktemp)
used=$(mktemp)
trap 'rm -f "$words" "$used"' EXIT
git grep -hoE '[A-Za-z_][A-Za-z0-9_]*' -- . ':!*.md' | sort -u >"$words"

# The part of a document that describes today's code.
doc_text() {
  case $1 in
  */PERFORMANCE.md)
    awk '/^## / && thresholds { exit } /^## AUTO thresholds/ { thresholds = 1 } { print }' "$1" ;;
  *) cat "$1" ;;
  esac
}

found() {
  local name=$1 f
  for f in "${foreign[@]}"; do
    if [[ $name == "$f" ]]; then
      echo "$f" >>"$used"
      return 0
    fi
  done
  grep -qxF -- "$name" "$words" && return 0
  if [[ $name == *_\* ]]; then
    grep -q "^${name%\*}" "$words" && return 0
  fi
  if [[ $name =~ ^(unit|integration|valgrind)_(.+)$ ]]; then
    grep -qxF -- "${BASH_REMATCH[2]}" "$words" && return 0
  fi
  return 1
}

bad=0
for doc in "$@"; do
  while read -r name; do
    if ! found "$name"; then
      echo "$doc names \`$name\`, which no source file has"
      bad=1
    fi
  done < <(doc_text "$doc" |
             grep -oE "(UCX's |libuv's )?\`[A-Za-z][A-Za-z0-9_]*_[A-Za-z0-9_]*(\*|\(\))?\`" |
             grep -v "^[A-Za-z]*'s " | tr -d '`()' | sort -u)
done
if ((all)); then
  for f in "${foreign[@]}"; do
    if ! grep -qxF -- "$f" "$used"; then
      echo "scripts/doc-names-check.sh lists \`$f\` as not gshm's, but no doc names it"
      bad=1
    fi
  done
fi
exit $bad
