#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gshmctl pull and glob characters, between two real gshmd on 127.0.0.1
# (host segments): with --prefix a '*' that ends NAME (or --as) is the
# prefix before it ('node7:llama/*' pulled nothing, the '*' taken
# literally), any other is refused naming the prefix to type; without
# --prefix a name with '*' is still a name (one of that name is pulled),
# and one that no peer exports says "did you mean --prefix".
#   test_pull_glob.sh GSHMD GSHMCTL PYTHON
set -u
gshmd=$1 ctl=$2 py=$3
. "$(dirname "$0")/lib.sh"

# usage errors, before gshmd is asked
run 2 pull 'node7:llama/7?b/' --prefix
has err "pull: 'llama/7?b/' is a pattern: --prefix takes the start of the names"
has err "write gshmctl pull 'node7:llama/7' --prefix for every segment whose name starts with 'llama/7'"
run 2 pull 'node7:llama/*/x' --prefix
has err "write gshmctl pull 'node7:llama/' --prefix"
run 2 pull 'node7:[ab]*' --prefix
has err "write gshmctl pull 'node7:' --prefix for all it exports"
run 2 pull 'node7:llama/*' --prefix --as 'v[2]/'
has err "pull: --as 'v[2]/' is a pattern"
run 2 pull 'node7:llama/*' --prefix --as '*'
has err "pull: --as needs a local prefix, not '*'"
# the '*' dropped, the '/' rule still holds ("v2" + "x" is "v2x")
run 2 pull 'node7:llama/*' --prefix --as v2
has err "write --as 'v2/'"

exports="llama/* odd*"
. "$(dirname "$0")/lib_nodes.sh"
for n in llama/a llama/b 'odd*'; do
  GSHM_SOCKET=$dir/n7 run 0 create "$n" 4K --mode 0644
done
export GSHM_SOCKET=$dir/n5

# 'llama/*' with --prefix: every segment under llama/, at once
run 0 pull 'node7:llama/*' --prefix
has out "pulled 2 segments under node7:llama/"
run 0 --json segments
"$py" -c 'import json,sys; n={s["name"] for s in json.load(open(sys.argv[1]))["segments"]}
sys.exit(0 if {"llama/a", "llama/b"} <= n else 1)' "$dir/out" || fail "no llama/a, llama/b: $(cat "$dir/out")"
# and a '*' that ends --as: the local prefix before it
run 0 pull 'node7:llama/*' --prefix --as 'v2/*'
has out "pulled 2 segments under node7:llama/"
run 0 segments
has out "v2/a"
has out "v2/b"
# without --prefix a '*' is a name's character: that segment is pulled
run 0 pull 'node7:odd*' --as odd
has out "pulled node7:odd* into 'odd'"
# and a name no peer exports, with a '*': the set pull meant, perhaps
run 5 pull 'node7:llama/*'
has err "did you mean --prefix: gshmctl pull 'node7:llama/' --prefix, every segment whose name starts with 'llama/'"
run 5 pull 'node7:nothing-here'
grep -qF -- "--prefix:" "$dir/err" && fail "a name without '*' told of --prefix: $(cat "$dir/err")"

[ "$failures" = 0 ] || exit 1
echo "ok"
