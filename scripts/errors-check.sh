#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Every errno client/include/gshm.h says a function returns has its row in
# common/errors.h's GSHM_ERRNO_MAP, so that gshm_strerror() explains it
# (-ECHILD said "unknown error" until it had one).  ctest runs it as the
# test `errors_table`.
set -euo pipefail
cd "$(dirname "$0")/.."
documented=$(grep -oh -- '-E[A-Z0-9]\+' client/include/gshm.h | tr -d - | sort -u)
tabled=$(grep -oh 'X(E[A-Z0-9]*' common/errors.h | sed 's/X(//' | sort -u)
missing=$(comm -23 <(echo "$documented") <(echo "$tabled"))
if [[ -n $missing ]]; then
  echo "errors-check: gshm.h documents errnos common/errors.h has no row for:" $missing >&2
  exit 1
fi
echo "errors-check: $(echo "$documented" | wc -l) documented errnos, each with a row"
