#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gshmctl read -o FILE that gshmctl writes in place (a regular file of
# several links, or another user's) and that is replaced between its
# lstat and its open, as another user of a group-writable directory
# without the sticky bit can: by a symbolic link (to a file of the
# reader's, which the open followed and truncated) or by another regular
# file (truncated and written).  Refused now, saying so, and neither is
# touched.  The fault shim makes the swap right after the lstat
# ($SWAP_AFTER_LSTAT).  Without a swap such a FILE is still written in
# place (same inode), and a symbolic link FILE already there is written
# through, as documented (gshmctl read: "a symbolic link ... is written
# in place"), also when it points at another user's file (as root).
#   test_read_swap.sh GSHMD GSHMCTL SHIM  (SHIM empty, in a sanitizer
#   build: skipped, exit 77)
set -u
gshmd=$1 ctl=$2 shim=$3
[ -n "$shim" ] || { echo "SKIP: no fault shim (sanitizer build)"; exit 77; }
. "$(dirname "$0")/lib.sh"

printf 'segment-bytes' >"$dir/in"
run 0 create seg 13
run 0 write seg -i "$dir/in"

# swapped SWAP_ARGS: FILE (two links: written in place) replaced by
# $dir/new after gshmctl's lstat of it; the read must be refused
swapped() {
  local what=$1 rc
  rm -f "$dir/file.bin" "$dir/file.link"
  echo old >"$dir/file.bin"
  ln -f "$dir/file.bin" "$dir/file.link"
  SWAP_AFTER_LSTAT="$dir/file.bin:$dir/new" LD_PRELOAD=$shim "$ctl" read seg -o "$dir/file.bin" \
    >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" = 1 ] || fail "$what: read -o exit $rc, want 1 ($(cat "$dir/err"))"
  has err "replaced while gshmctl opened it"
  [ -e "$dir/new" ] && fail "$what: the shim did not swap"
}
# by a symbolic link to a file of the reader's
echo precious >"$dir/victim"
ln -s "$dir/victim" "$dir/new"
swapped "symbolic link"
[ "$(cat "$dir/victim")" = precious ] || fail "the link's target was written: $(od -c "$dir/victim" | head -2)"
# by another regular file
echo theirs >"$dir/new"
swapped "another file"
[ "$(cat "$dir/file.bin")" = theirs ] || fail "the other file was written: $(od -c "$dir/file.bin" | head -2)"
[ "$(cat "$dir/file.link")" = old ] || fail "FILE's other link changed"

# no swap: in place, the same inode, both links see the bytes
rm -f "$dir/file.bin" "$dir/file.link"
echo old >"$dir/file.bin"
ln -f "$dir/file.bin" "$dir/file.link"
ino=$(stat -c %i "$dir/file.bin")
run 0 read seg -o "$dir/file.bin"
[ "$(stat -c %i "$dir/file.bin")" = "$ino" ] || fail "in place: FILE is another inode"
[ "$(cat "$dir/file.link")" = segment-bytes ] || fail "in place: $(od -c "$dir/file.link" | head -2)"

# a symbolic link FILE: written through (the link stays); as root, also
# to another user's file, which stays theirs
echo old >"$dir/target"
[ "$(id -u)" = 0 ] && chown 65534:65534 "$dir/target"
ln -s "$dir/target" "$dir/sym.bin"
run 0 read seg -o "$dir/sym.bin"
[ -L "$dir/sym.bin" ] || fail "the symbolic link FILE was replaced"
[ "$(cat "$dir/target")" = segment-bytes ] || fail "through the link: $(od -c "$dir/target" | head -2)"
[ "$(id -u)" != 0 ] || [ "$(stat -c %u "$dir/target")" = 65534 ] || fail "the target changed owner"

[ "$failures" = 0 ] || exit 1
echo "ok"
