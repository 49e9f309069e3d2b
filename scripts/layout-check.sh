#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# README.md's "Layout" section and docs/ARCHITECTURE.md's "Layers" section
# name every file of daemon/ and daemon/cluster/, and every source file of
# client/, common/, proto/, kernels/, bench/ and python/gshm/ (a new or
# split file is added to both maps; CMakeLists.txt files need not be
# named), and README's names each C file under its own directory.  ctest
# runs it as the test `house_layout`.
#
#   scripts/layout-check.sh        lists the names a map lacks; exit 1 if any
set -euo pipefail

cd "$(dirname "$0")/.."

# The text of one "## " section of a Markdown file.
section() {
  awk -v want="## $2" '$0 == want { on = 1; next } on && /^## / { exit } on' "$1"
}

readme=$(section README.md Layout)
layers=$(section docs/ARCHITECTURE.md Layers)
[[ -n $readme && -n $layers ]] || { echo "layout-check: a section is missing" >&2; exit 2; }

bad=0
while read -r f; do
  name=${f##*/}
  for doc in README.md docs/ARCHITECTURE.md; do
    text=$readme
    [[ $doc == README.md ]] || text=$layers
    if ! grep -qFw -- "$name" <<<"$text"; then
      echo "$doc does not name $f"
      bad=1
    fi
  done
done < <({
  find daemon -maxdepth 2 -type f
  find client common proto kernels bench -type f ! -name CMakeLists.txt
  find python/gshm -type f ! -name '*.pyc'
} | sort)

# And README.md's map puts each C or CUDA file where it is: a name in a
# directory's entry (its line and the indented lines after it) is a file
# under that directory, unless written with its path (common/arena.c) or
# as a possessive (gshm.h's structs).  arena.c moved to common/ while the
# map kept it under client/.
while read -r dir name; do
  if [[ -z $(git ls-files -- "$dir" | grep -E "(^|/)${name//./\\.}$") ]]; then
    echo "README.md names $name under $dir/, which has no such file"
    bad=1
  fi
done < <(awk '/^```/ { next } /^[^ ]/ { dir = $1; sub(/\/$/, "", dir) }
              { line = $0; if (/^[^ ]/) line = substr(line, length($1) + 1)
                while (match(line, /(^|[^\/A-Za-z0-9_.+-])[A-Za-z0-9_+-]+\.(c|h|cu)([^A-Za-z0-9_.\x27]|\x27[^s]|$)/)) {
                  word = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH - 1)
                  sub(/^[^A-Za-z0-9_+-]/, "", word); match(word, /^[A-Za-z0-9_+-]+\.(c|h|cu)/)
                  print dir, substr(word, 1, RLENGTH)
                } }' <<<"$readme")
exit $bad
