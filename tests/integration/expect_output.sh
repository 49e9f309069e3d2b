#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# expect_output.sh ERE CMD [ARGS...]: runs CMD, passes its output on, and
# fails unless CMD exits 0 and its output (stdout and stderr, newlines
# read as spaces) matches the extended regular expression ERE.  ctest's
# PASS_REGULAR_EXPRESSION alone ignores the exit status: a demo that
# printed "demo ok" and then failed (a leak that LeakSanitizer reports at
# exit, output that could not be written) passed.
ere=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" != 0 ]; then
  echo "FAIL: exit $rc: $*"
  exit 1
fi
if ! printf '%s\n' "$out" | tr '\n' ' ' | grep -Eq -- "$ere"; then
  echo "FAIL: the output does not match '$ere'"
  exit 1
fi
