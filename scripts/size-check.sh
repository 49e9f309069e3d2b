#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# The size rule of the daemon (docs/ARCHITECTURE.md "Tests"): no C file over
# 700 lines and no function over 80 lines, counted from the first line of
# its signature to its closing brace.  ctest runs it as the test `house`.
#
#   scripts/size-check.sh [--list] [DIR...]   (DIR: default daemon, which
#                                              includes daemon/cluster)
#
# Prints each file and function over its limit and exits 1 if there is one;
# --list prints every function's length instead (longest first) and exits 0.
# Function bodies come from universal-ctags (`--fields=+ne`: each
# function's first and end line) where it is installed; elsewhere from an
# awk pass over the top-level braces, which relies on the project's
# formatting (a function's closing brace alone in column 0).
# GSHM_SIZE_CHECK_TOOL=awk or ctags picks one (ctest house_awk runs the awk
# pass, so that both stay right).
set -euo pipefail

readonly MAX_FILE_LINES=700
readonly MAX_FUNCTION_LINES=80

cd "$(dirname "$0")/.."
list=0
if [[ ${1:-} == --list ]]; then
  list=1
  shift
fi
dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=(daemon)

mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' \) | sort)
[[ ${#files[@]} -gt 0 ]] || { echo "size-check: no C files under ${dirs[*]}" >&2; exit 2; }

tool=${GSHM_SIZE_CHECK_TOOL:-}
if [[ -z $tool ]]; then
  if ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then tool=ctags; else tool=awk; fi
fi

# One line per function: LENGTH FILE:LINE NAME.
functions() {
  case $tool in
  ctags)
    ctags --fields=+ne --kinds-C=f --language-force=C -x \
      --_xformat='%{end} %{line} %F %N' -o - "${files[@]}" |
      awk '{ print $1 - $2 + 1, $3 ":" $2, $4 }'
    ;;
  awk)
    awk '
      FNR == 1 { sig = 0; infn = 0 }
      infn && /^}/ { print FNR - start + 1, FILENAME ":" start, name; infn = 0; sig = 0; next }
      infn { next }
      /^$/ || /^}/ || /^#/ { sig = 0; next }
      /^[A-Za-z_]/ && !sig { sig = FNR; text = "" }
      sig { text = text $0 " " }
      sig && (/\)[ \t]*\{[ \t]*$/ || /^\{[ \t]*$/) && text !~ /=/ {
        infn = 1; start = sig
        name = text; sub(/[ \t]*\(.*/, "", name); sub(/.*[ \t*]/, "", name)
        next
      }
      sig && /;[ \t]*$/ { sig = 0 }
      sig && /\{[ \t]*$/ { sig = 0 }  # a struct, enum or initializer
    ' "${files[@]}"
    ;;
  *)
    echo "size-check: GSHM_SIZE_CHECK_TOOL is ctags or awk, not '$tool'" >&2
    exit 2
    ;;
  esac
}

if ((list)); then
  functions | sort -rn
  exit 0
fi

bad=0
while read -r n f; do
  [[ $f == total ]] && continue
  if ((n > MAX_FILE_LINES)); then
    echo "$f: $n lines (at most $MAX_FILE_LINES)"
    bad=1
  fi
done < <(wc -l "${files[@]}")
# (not read from a process substitution, whose status is lost: a tool that
# failed or found no function left every function unchecked, and passed)
fns=$(functions) || { echo "size-check: $tool failed on ${dirs[*]}" >&2; exit 2; }
nfns=0
while read -r n where name; do
  [[ -n $n ]] || continue
  nfns=$((nfns + 1))
  if ((n > MAX_FUNCTION_LINES)); then
    echo "$where: $name: $n lines (at most $MAX_FUNCTION_LINES)"
    bad=1
  fi
done <<<"$fns"
if ((nfns < ${#files[@]} / 2)); then
  echo "size-check ($tool): found $nfns functions in ${#files[@]} files: the count failed" >&2
  exit 2
fi
if ((bad)); then
  echo "size-check ($tool): split what is over its limit (one job per file, a helper per step)" >&2
  exit 1
fi
echo "size-check ($tool): ${#files[@]} files under ${dirs[*]}, none over $MAX_FILE_LINES lines," \
  "none of $nfns functions over $MAX_FUNCTION_LINES"
