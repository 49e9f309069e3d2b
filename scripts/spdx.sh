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
# line where there are.  Nothing else of the file changes (sed keeps a
# missing final newline missing); mode and owner stay.
add_line() {
  local f=$1 style=$2 text after=0 line
  case "$style" in
    c) text="/* $SPDX */" ;;
    slash) text="// $SPDX" ;;
    hash) text="# $SPDX" ;;
  esac
  if [ ! -s "$f" ]; then
    printf '%s\n' "$text" >"$f"
    return
  fi
  IFS= read -r line <"$f" || true
  case "$line" in '#!'*) after=1 ;; esac
  line=$(sed -n "$((after + 1))p" "$f")
  if [ "${f%.py}" != "$f" ] && [ "$after" -lt 2 ] && printf '%s\n' "$line" | grep -Eq '^[[:space:]]*#.*coding[:=][[:space:]]*[-_.a-zA-Z0-9]+'; then
    after=$((after + 1))
  fi
  if [ "$after" -eq 0 ]; then
    sed -i "1i\\$text" "$f"
  else
    sed -i "${after}a\\$text" "$f"
  fi
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
