#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gshmctl mappings and --json mappings say the same of every lease: a
# host segment held mapped by a Python client shows DEVICES "cpu" in the
# table and "mapped": true, "cpu": true, "devices": [] in the JSON (before,
# the JSON said only "devices": [], which reads as mapped nowhere).  A
# segment name and a client name longer than their columns widen them:
# the columns after them stay in line in mappings and clients.
#   test_mappings_json.sh GSHMD GSHMCTL PYTHON SOURCE_DIR LIBGSHM
set -u
gshmd=$1 ctl=$2 py=$3 src=$4 lib=$5
dir=$(mktemp -d)
"$gshmd" --backend host --socket "$dir/s" --log-level 3 2>"$dir/gshmd.log" &
pid=$!
holder=
# (the holder and gshmd must both exit 0: their statuses were not looked at)
trap 'rc=$?; exec 3>&- 2>/dev/null
      [ -z "$holder" ] || wait $holder || { echo "FAIL: the Python client exited $?"; rc=1; }
      kill $pid 2>/dev/null; wait $pid || { echo "FAIL: gshmd exited $? at its SIGTERM"; rc=1; }
      rm -rf "$dir"; exit $rc' EXIT
for _ in $(seq 200); do [ -S "$dir/s" ] && break; sleep 0.05; done
export GSHM_SOCKET=$dir/s GSHM_LIBRARY=$lib PYTHONPATH=$src/python
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A client that creates host segment "m/cpu" (mapped at once) and one of
# a long name, says so on stdout and holds them until its stdin closes.
mkfifo "$dir/in"
"$py" -c '
import sys, gshm
with gshm.Client(sys.argv[1], name="a-client-named-past-its-columns-\u00e9") as c, \
     c.create("m/cpu", 8192, location="host") as seg, \
     c.create("m/" + "w" * 40 + "/\u00e9", 8192, location="host") as seg2:
    assert seg.mapped
    print("ready", flush=True)
    sys.stdin.read()
' "$dir/s" <"$dir/in" >"$dir/holder.out" 2>"$dir/holder.err" &
holder=$!
exec 3>"$dir/in"
for _ in $(seq 200); do grep -q ready "$dir/holder.out" 2>/dev/null && break; sleep 0.05; done
grep -q ready "$dir/holder.out" || fail "the Python client did not start: $(cat "$dir/holder.err")"

"$ctl" mappings >"$dir/text" 2>"$dir/err" || fail "gshmctl mappings: $(cat "$dir/err")"
"$ctl" --json mappings >"$dir/json" 2>"$dir/err" || fail "gshmctl --json mappings: $(cat "$dir/err")"
row=$(grep '^m/cpu ' "$dir/text")
[ "$(awk '{print $NF}' <<<"$row")" = cpu ] || fail "the table's DEVICES is not cpu: $row"
"$py" - "$dir/json" <<'PY' || fail "--json mappings disagrees with the table: $(cat "$dir/json")"
import json, sys
rows = [m for m in json.load(open(sys.argv[1]))["mappings"] if m["segment"] == "m/cpu"]
assert len(rows) == 1, rows
m = rows[0]
assert m["mapped"] is True and m.get("cpu") is True and m["devices"] == [], m
PY

# aligned FILE COLUMN: every row's field of the left-aligned COLUMN
# starts where its heading (the first line) does, in characters
aligned() {
  "$py" - "$dir/$1" "$2" <<'PY' || fail "column $2 of $1 is not aligned: $(cat "$dir/$1")"
import sys
head, *rows = open(sys.argv[1], encoding="utf-8").read().splitlines()
off = head.index(sys.argv[2])
assert len(rows) >= 2 and all(r[off - 1] == " " and r[off] != " " for r in rows), rows
PY
}
aligned text ACCESS
"$ctl" clients >"$dir/clients" 2>"$dir/err" || fail "gshmctl clients: $(cat "$dir/err")"
aligned clients SINCE

exec 3>&-
wait $holder || fail "the Python client failed: $(cat "$dir/holder.err")"
holder=
[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
