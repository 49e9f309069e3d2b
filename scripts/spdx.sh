#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# Every source file of gshm carries one line
#     SPDX-License-Identifier: Apache-2.0
# in its own comment syntax, in its first lines (after a shebang, and after
# a Python coding line, which must stay within the first two lines).
#
#   scripts/spdx.sh --check   list the source files that lack the line; exit 1 if any
#   scripts/spdx.sh --fix     add the line where it is missing (idempotent: a file
#                             that has it is left byte for byte as it is)
#
# Source files, by name:
#   /* */  *.c *.h *.cu *.cuh
#   //     *.proto
#   #      *.sh *.py *.cmake *.cmake.in CMakeLists.txt *.toml *.pc.in *.supp,
#          systemd units and snippets (*.service *.service.in *.socket
#          *.tmpfiles *.sysusers), *.conf, and any other file that starts
#          with a shebang (.ci/run)
# Not source: documentation (*.md), the fuzz seed corpus (binary messages),
# .gitignore files, and conf/gshmd.conf, which `gshmd --print-config`
# generates and test "config" compares byte for byte with that output (its
# generator, daemon/config.c, carries the line).
#
# Files come from git (tracked, plus untracked ones git does not ignore), or
# from find outside a git checkout (build*/ and .git pruned).
set -euo pipefail

readonly SPDX="SPDX-License-Identifier: Apache-2.0"
readonly MARK="SPDX-License-Identifier:"
# the line must be within this many lines of the top (shebang, coding line)
readonly HEAD_LINES=4

usage() {
  echo "usage: $0 --check | --fix" >&2
  exit 2
}

[ $# -eq 1 ] || usage
mode=$1
case "$mode" in --check | --fix) ;; *) usage ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

list_files() {
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard
  else
    find . \( -name .git -o -name 'build*' -o -name __pycache__ \) -prune -o -type f -print0 |
      sed -z 's|^\./||'
  fi
}

# The comment style of file $1 (c, slash, hash), or nothing when it is not source.
style_of() {
  local f=$1
  case "$f" in
    tests/fuzz/corpus/* | conf/gshmd.conf | *.md | .gitignore | */.gitignore) return ;;
    *.c | *.h | *.cu | *.cuh) echo c ;;
    *.proto) echo slash ;;
    *.sh | *.py | *.cmake | *.cmake.in | CMakeLists.txt | */CMakeLists.txt | *.toml | *.pc.in | \
      *.supp | *.service | *.service.in | *.socket | *.tmpfiles | *.sysusers | *.conf)
      echo hash ;;
    *)
      if [ -f "$f" ] && [ "$(head -c 2 "$f")" = "#!" ]; then
        echo hash
      fi
      ;;
  esac
}

has_line() {
  head -n "$HEAD_LINES" "$1" | grep -q "$MARK"
}

# Adds the line to file $1 in style $2, after a shebang and a Python coding
# line where there are; the file keeps its inode, mode and owner.
add_line() {
  local f=$1 style=$2 text tmp
  case "$style" in
    c) text="/* $SPDX */" ;;
    slash) text="// $SPDX" ;;
    hash) text="# $SPDX" ;;
  esac
  tmp=$(mktemp)
  awk -v text="$text" '
    function coding(s) { return s ~ /^[ \t\f]*#.*coding[:=][ \t]*[-_.a-zA-Z0-9]+/ }
    !done && NR == 1 && /^#!/ { print; next }
    !done && NR <= 2 && coding($0) { print; next }
    !done { print text; done = 1 }
    { print }
    END { if (!done) print text }
  ' "$f" >"$tmp"
  cat "$tmp" >"$f"
  rm -f "$tmp"
}

missing=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  style=$(style_of "$f")
  [ -n "$style" ] || continue
  has_line "$f" && continue
  if [ "$mode" = --check ]; then
    echo "$f"
    missing=$((missing + 1))
  else
    add_line "$f" "$style"
    echo "added: $f"
  fi
done < <(list_files)

if [ "$mode" = --check ] && [ "$missing" -gt 0 ]; then
  echo "spdx: $missing source file(s) lack '$SPDX' (scripts/spdx.sh --fix adds it)" >&2
  exit 1
fi
exit 0
