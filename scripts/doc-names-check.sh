#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# The code names a document gives in backquotes (`gshmd__relay_landed`,
# `GSHM_ERRNO_MAP`, `take_no_driver()`: one word with an underscore) are
# words of a tracked file that is not Markdown, so that a renamed or
# removed function, macro, field or test leaves no stale name in the docs
# (docs/ARCHITECTURE.md named pull.c's `grant_is_listed` long after it
# became sources.c's gshmd__pull_grant_is_listed).  A name the text gives
# as another project's ("UCX's `UCT_CUDADRV_FUNC`", libuv's) is not
# checked, nor an abbreviation that starts with '_' (`_open` after
# `gshmd_registry_create`).  ctest runs it on docs/ARCHITECTURE.md as the
# test `docs_names`.
#
#   scripts/doc-names-check.sh [FILE.md...]   lists the names no file has;
#                                             exit 1 if any
set -euo pipefail

cd "$(dirname "$0")/.."
(($#)) || set -- docs/ARCHITECTURE.md

words=$(mktemp)
trap 'rm -f "$words"' EXIT
git grep -hoE '[A-Za-z_][A-Za-z0-9_]*' -- . ':!*.md' | sort -u >"$words"

bad=0
for doc in "$@"; do
  while read -r name; do
    if ! grep -qxF -- "$name" "$words"; then
      echo "$doc names \`$name\`, which no source file has"
      bad=1
    fi
  done < <(grep -oE "(UCX's |libuv's )?\`[A-Za-z][A-Za-z0-9_]*_[A-Za-z0-9_]*(\(\))?\`" "$doc" |
             grep -v "^[A-Za-z]*'s " | tr -d '`()' | sort -u)
done
exit $bad
