#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configuration contract of gshmd: option table, INI files, drop-ins,
# environment and flags.
#
# usage: test_config.sh GSHMD COMMITTED_CONF [valgrind]
#   GSHMD            the built gshmd binary
#   COMMITTED_CONF   conf/gshmd.conf from the source tree
#   valgrind         run the error and success paths under valgrind instead
set -euo pipefail

gshmd=$1
committed=$2
mode=${3:-}

unset GSHM_SOCKET JOURNAL_STREAM
export LC_ALL=C

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run EXPECTED_RC CMD...: runs CMD with stdout in $tmp/out and stderr in
# $tmp/err and checks its exit status.
run() {
  local want=$1 rc=0
  shift
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [[ $rc != "$want" ]]; then
    fail "exit $rc, wanted $want: $*"
    sed 's/^/  stderr: /' "$tmp/err" >&2
    return 1
  fi
}

# expect_err PATTERN: the last run's stderr matches the fixed string.
expect_err() {
  if ! grep -qF -- "$1" "$tmp/err"; then
    fail "stderr lacks '$1'"
    sed 's/^/  stderr: /' "$tmp/err" >&2
  fi
}

# effective SECTION KEY ARGS...: value of SECTION.KEY from --dump-config.
effective() {
  local section=$1 key=$2
  shift 2
  "$gshmd" --dump-config "$@" |
    awk -v s="[$section]" -v k="$key" '
      /^\[/ { cur = $0; next }
      cur == s && $1 == k { sub(/^[^=]*= ?/, ""); print; found = 1 }
      END { exit !found }'
}

# expect_value SECTION KEY WANT ARGS...
expect_value() {
  local section=$1 key=$2 want=$3 got
  shift 3
  if ! got=$(effective "$section" "$key" "$@"); then
    fail "--dump-config $* did not print $section.$key"
  elif [[ $got != "$want" ]]; then
    fail "$section.$key = '$got', wanted '$want' (args: $*)"
  fi
}

if [[ $mode == valgrind ]]; then
  command -v valgrind >/dev/null || { echo "SKIP: valgrind not installed"; exit 77; }
  vg=(valgrind -q --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all
      --suppressions="$(dirname "$0")/../valgrind-ucx.supp" --error-exitcode=99)
  mkdir "$tmp/conf.d"
  printf '[daemon]\nsocket = /tmp/a.sock\nsocket_group = root\n[metrics]\ntextfile = /tmp/m\n' \
    >"$tmp/main.conf"
  printf '[daemon]\nadmin_group = wheel\nbackend = cuda\nbackend = host\n' >"$tmp/conf.d/10-a.conf"
  run 0 "${vg[@]}" "$gshmd" --check-config --dump-config --config "$tmp/main.conf" \
    --socket /tmp/b.sock --set daemon.admin_group=adm || true
  run 0 "${vg[@]}" "$gshmd" --help || true
  run 0 "${vg[@]}" "$gshmd" --print-config || true
  printf '[daemon]\nsocket = /x\nbogus = 1\n' >"$tmp/conf.d/20-bad.conf"
  run 2 "${vg[@]}" "$gshmd" --check-config --config "$tmp/main.conf" || true
  run 2 "${vg[@]}" "$gshmd" --check-config --config "$tmp/main.conf" --no-such-flag || true
  run 1 "${vg[@]}" "$gshmd" --check-config --config "$tmp/missing.conf" || true
  [[ $failures == 0 ]] || { echo "$failures failure(s)" >&2; exit 1; }
  echo "ok: valgrind clean"
  exit 0
fi

# --- generated outputs -------------------------------------------------------

# --print-config is the committed file, byte for byte.
run 0 "$gshmd" --print-config || true
if ! cmp -s "$tmp/out" "$committed"; then
  fail "conf/gshmd.conf is stale; regenerate with: gshmd --print-config > conf/gshmd.conf"
  diff -u "$committed" "$tmp/out" >&2 || true
fi

# Every key of the file, as section.key.
mapfile -t keys < <(awk '/^\[/ { s = substr($0, 2, length($0) - 2); next }
                         /^#[a-z_]+ =/ { k = substr($1, 2); print s "." k }' "$committed")
if ((${#keys[@]} < 20)); then
  fail "found only ${#keys[@]} keys in $committed"
fi

# --help names every key and every section.
run 0 "$gshmd" --help || true
for k in "${keys[@]}"; do
  grep -qF -- "$k = " "$tmp/out" || fail "--help does not mention $k"
done
grep -qF -- "--check-config" "$tmp/out" || fail "--help does not mention --check-config"
# and, as a man page would, its exit statuses (75: the restart that
# gshmd.service's Restart=on-failure answers)
for x in "Exit status:" "  2   " "  75  "; do
  grep -qF -- "$x" "$tmp/out" || fail "--help lacks '$x'"
done

run 0 "$gshmd" --version || true
grep -qE '^gshmd [0-9]+\.[0-9]+' "$tmp/out" || fail "--version printed '$(cat "$tmp/out")'"

# The committed file itself is a valid configuration.
run 0 "$gshmd" --check-config --config "$committed" || true
[[ $(cat "$tmp/out") == "gshmd: configuration ok (read $committed)" ]] \
  || fail "--check-config printed '$(cat "$tmp/out")'"

# --- values --------------------------------------------------------------------

cat >"$tmp/good.conf" <<'EOF'
; a comment
# another comment
[daemon]
socket = /tmp/gshm-test/gshmd.sock
socket_mode = 0600
socket_group = root
backend = host   ; inline comment
log_level = debug
legacy_ipc = yes

[limits]
max_connections = 12
max_packet = 8K
max_segment_size = 2G
[quota]
host_bytes = 1T
cuda_bytes = 3M
segments = 7

[metrics]
textfile = /var/lib/node_exporter/gshm.prom
EOF
run 0 "$gshmd" --check-config --config "$tmp/good.conf" || true
expect_value daemon socket /tmp/gshm-test/gshmd.sock --config "$tmp/good.conf"
expect_value daemon socket_mode 0600 --config "$tmp/good.conf"
expect_value daemon socket_group root --config "$tmp/good.conf"
expect_value daemon backend host --config "$tmp/good.conf"
expect_value daemon log_level 7 --config "$tmp/good.conf"
expect_value daemon legacy_ipc true --config "$tmp/good.conf"
expect_value limits max_connections 12 --config "$tmp/good.conf"
expect_value limits max_packet 8192 --config "$tmp/good.conf"
expect_value limits max_segment_size 2147483648 --config "$tmp/good.conf"
expect_value quota host_bytes 1099511627776 --config "$tmp/good.conf"
expect_value quota cuda_bytes 3145728 --config "$tmp/good.conf"
expect_value quota segments 7 --config "$tmp/good.conf"
# sizes take K, M, G, T alone, with B or with iB, as gshmctl's do
# (README: 4K = 4KB = 4KiB); "4GiB" was "not a size"
expect_value quota host_bytes 4294967296 --config "$tmp/good.conf" --set quota.host_bytes=4GiB
expect_value quota host_bytes 8192 --config "$tmp/good.conf" --set quota.host_bytes=8KB
expect_value quota host_bytes 100 --config "$tmp/good.conf" --set quota.host_bytes=100B
expect_value limits max_name 255 --config "$tmp/good.conf" # untouched default
expect_value metrics textfile /var/lib/node_exporter/gshm.prom --config "$tmp/good.conf"
for b in true:true false:false yes:true no:false on:true off:false 1:true 0:false; do
  expect_value daemon legacy_ipc "${b#*:}" --config "$tmp/good.conf" --set "daemon.legacy_ipc=${b%:*}"
done

# poll_us: its default holds where gshmd may run on 4+ CPUs (else 0); a
# value that is set applies on any machine.
want_poll=$([[ $(nproc) -ge 4 ]] && echo 30 || echo 0)
expect_value daemon poll_us "$want_poll" --config "$tmp/good.conf"
expect_value daemon poll_us 0 --config "$tmp/good.conf" --set daemon.poll_us=0
expect_value daemon poll_us 50 --config "$tmp/good.conf" --set daemon.poll_us=50
expect_value daemon poll_us 30 --config "$tmp/good.conf" --set daemon.poll_us=30

# --dump-config prints a file that reads back to the same configuration.
"$gshmd" --dump-config --config "$tmp/good.conf" >"$tmp/dump.conf"
"$gshmd" --dump-config --config "$tmp/dump.conf" >"$tmp/dump2.conf"
cmp -s "$tmp/dump.conf" "$tmp/dump2.conf" || fail "--dump-config output does not read back"
# what it prints could not be written (a full disk under "gshmd
# --dump-config > gshmd.conf"): exit 1 saying so, not 0 over a cut file
if [[ -w /dev/full ]]; then
  for args in "--print-config" "--dump-config" "--help" "--version" "--check-config"; do
    "$gshmd" $args --config "$tmp/good.conf" >/dev/full 2>"$tmp/err" && rc=0 || rc=$?
    [[ $rc == 1 ]] || fail "gshmd $args >/dev/full: exit $rc, wanted 1"
    grep -q "writing to stdout: No space left on device" "$tmp/err" \
      || fail "gshmd $args >/dev/full: $(cat "$tmp/err")"
  done
fi

# A line of cluster.peers or cluster.export that ends with '\' continues on
# the next: libinih holds a line to 197 bytes, 8 peers (before: 9 peers in a
# gshmd.conf stopped gshmd with "line longer than 197 bytes").  A comment's
# '\' continues nothing; --dump-config writes such a list back over lines.
{
  printf '[cluster]\npeers = '
  for i in $(seq 1 20); do printf 'node%d=10.0.0.%d:7470 \\\n    ' "$i" "$i"; done
  printf 'node21=10.0.0.21:7470\n# a comment \\\nexport = llama/*  \\\n  mistral/*\n'
} >"$tmp/list.conf"
run 0 "$gshmd" --dump-config --config "$tmp/list.conf" --set cluster.listen= && {
  cp "$tmp/out" "$tmp/list-dump.conf"
  tr -d '\\\n' <"$tmp/list-dump.conf" | tr -s " " | grep -qF "node20=10.0.0.20:7470 node21=10.0.0.21:7470" ||
    fail "--dump-config lacks the 21 continued peers"
  grep -qx 'export = llama/\* mistral/\*' "$tmp/list-dump.conf" || fail "export's continued line lost"
  awk 'length > 197 { exit 1 }' "$tmp/list-dump.conf" || fail "--dump-config wrote a line past 197 bytes"
  run 0 "$gshmd" --dump-config --config "$tmp/list-dump.conf"
  cmp -s "$tmp/out" "$tmp/list-dump.conf" || fail "a continued list does not read back"
}

# A long list, continued over many lines: cluster.peers held 4095 bytes
# once joined (about 140 peers: 500 stopped gshmd with "longer than 4095
# bytes"); it holds 16383 (GSHMD_CONFIG_LIST_MAX), and --dump-config
# wrote string values through a PATH_MAX buffer, which would cut such a
# list.  One byte past the cap is still refused, naming it.
# big_list N FILE: N peers of cluster.peers, 5 to a line
big_list() {
  {
    printf '[cluster]\npeers ='
    for i in $(seq 1 "$1"); do
      printf ' n%d=10.%d.%d.1:7470' "$i" $((i / 250)) $((i % 250))
      [ $((i % 5)) = 0 ] && [ "$i" != "$1" ] && printf ' \\\n '
    done
    printf '\n'
  } >"$2"
}
big_list 500 "$tmp/big.conf"
run 0 "$gshmd" --dump-config --config "$tmp/big.conf" --set cluster.listen= && {
  cp "$tmp/out" "$tmp/big-dump.conf"
  tr -d '\\\n' <"$tmp/big-dump.conf" | tr -s " " | grep -qF "n499=10.1.249.1:7470 n500=10.2.0.1:7470" ||
    fail "--dump-config lacks the last of 500 continued peers"
  run 0 "$gshmd" --dump-config --config "$tmp/big-dump.conf" --set cluster.listen=
  cmp -s "$tmp/out" "$tmp/big-dump.conf" || fail "500 continued peers do not read back"
}
big_list 900 "$tmp/huge.conf"
run 2 "$gshmd" --check-config --config "$tmp/huge.conf" --set cluster.listen= &&
  expect_err "longer than 16383 bytes"

# --- errors name the file, the line and the key ------------------------------

# bad_file EXPECTED_RC LINE KEY MESSAGE CONTENT: CONTENT in a file must fail.
n=0
bad_file() {
  local rc=$1 line=$2 key=$3 msg=$4 content=$5 f
  n=$((n + 1))
  f="$tmp/bad$n.conf"
  printf '%b' "$content" >"$f"
  run "$rc" "$gshmd" --check-config --config "$f" || return 0
  expect_err "$f:$line:"
  expect_err "'$key'"
  expect_err "$msg"
  [[ ! -s $tmp/out ]] || fail "configuration error but stdout says '$(cat "$tmp/out")'"
}
bad_file 2 4 daemon.no_such_key "unknown key" '[daemon]\nsocket = /a\n\nno_such_key = 1\n'
bad_file 2 2 nosuch.key "unknown key" '[nosuch]\nkey = 1\n'
bad_file 2 1 orphan "unknown key" 'orphan = 1\n[daemon]\n'
bad_file 2 3 daemon.log_level "only cluster.peers and cluster.export continue" \
  '[daemon]\nlog_level = info \\\n  debug\n'
bad_file 2 3 cluster.admin "unknown key" '[cluster]\npeers = a=1.2.3.4:1 # c \\\nadmin = x\n'
# an unknown key names the key it was likely meant to be (a typo, a key of
# another section, the start of a key) and where every key is listed; two
# as near are no guess
bad_file 2 2 daemon.sokcet "did you mean 'daemon.socket'?" '[daemon]\nsokcet = /a\n'
bad_file 2 2 deamon.socket "did you mean 'daemon.socket'?" '[deamon]\nsocket = /a\n'
bad_file 2 2 daemon.listen "did you mean 'cluster.listen'?" '[daemon]\nlisten = 127.0.0.1:1\n'
bad_file 2 2 cluster.secret "did you mean 'cluster.secret_file'?" '[cluster]\nsecret = /k\n'
bad_file 2 1 socket "every key belongs in a [section] (did you mean 'daemon.socket'?" 'socket = /a\n'
bad_file 2 2 daemon.host "unknown key 'daemon.host' (gshmd --help lists every key)" \
  '[daemon]\nhost = 1\n'
# a size that is none says what a size is: "1.5G" was a "bad size suffix"
for v in 1.5G 64X; do
  run 2 "$gshmd" --check-config --config "$tmp/good.conf" --set "limits.max_segment_size=$v" || true
  expect_err "key 'limits.max_segment_size': not a size: a whole number of bytes, alone or with K, M, G or T"
done
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --set cluster.pull_chunks=1M || true
expect_err "--set: unknown key 'cluster.pull_chunks' (did you mean 'cluster.pull_chunk'?"
# A retired key (read by an older release) warns and is ignored: an
# upgrade must not stop gshmd over a key that no longer does anything.
printf '[daemon]\nwatchdog_sec = 30\n' >"$tmp/retired.conf"
if run 0 "$gshmd" --check-config --config "$tmp/retired.conf"; then
  expect_err "$tmp/retired.conf:2:"
  expect_err "'daemon.watchdog_sec' is no longer read"
fi
# A key set again in the same file: inih hands over each occurrence and the
# last one was taken silently.  One warning per such key names it, the
# lines and the value that wins; the file is read as before.
printf '[daemon]\nlog_level = 4\nsocket = /a.sock\n\n[limits]\nmax_name = 100\n[daemon]\nlog_level = 6\n' \
  >"$tmp/twice.conf"
if run 0 "$gshmd" --check-config --config "$tmp/twice.conf"; then
  expect_err "gshmd: warning: $tmp/twice.conf:8: key 'daemon.log_level' is set 2 times in this file (first on line 2): the last value, '6' on line 8, wins"
  [[ $(grep -c "times in this file" "$tmp/err") == 1 ]] || fail "twice.conf: not one warning: $(cat "$tmp/err")"
  grep -q "configuration ok" "$tmp/out" || fail "twice.conf: not ok: $(cat "$tmp/out")"
fi
expect_value daemon log_level 6 --config "$tmp/twice.conf"
expect_value limits max_name 100 --config "$tmp/twice.conf"
printf '[limits]\nmax_name = 100\nmax_name = 101\nmax_name = 102\n' >"$tmp/thrice.conf"
if run 0 "$gshmd" --check-config --config "$tmp/thrice.conf"; then
  expect_err "thrice.conf:4: key 'limits.max_name' is set 3 times in this file (first on line 2): the last value, '102' on line 4, wins"
  [[ $(grep -c "times in this file" "$tmp/err") == 1 ]] || fail "thrice.conf: not one warning: $(cat "$tmp/err")"
fi
# once in a file, and again in a drop-in (what drop-ins are for): nothing
mkdir -p "$tmp/once/conf.d"
printf '[daemon]\nlog_level = 4\n[limits]\nmax_name = 100\n' >"$tmp/once/gshmd.conf"
printf '[daemon]\nlog_level = 5\n' >"$tmp/once/conf.d/10-a.conf"
if run 0 "$gshmd" --check-config --config "$tmp/once/gshmd.conf"; then
  [[ ! -s $tmp/err ]] || fail "a file without repeats warns: $(cat "$tmp/err")"
fi
# a drop-in that repeats a key itself is named
printf '[daemon]\nlog_level = 5\nlog_level = 6\n' >"$tmp/once/conf.d/20-b.conf"
if run 0 "$gshmd" --check-config --config "$tmp/once/gshmd.conf"; then
  expect_err "$tmp/once/conf.d/20-b.conf:3: key 'daemon.log_level' is set 2 times in this file"
fi
bad_file 2 3 limits.max_connections "not a non-negative number" '[daemon]\n[limits]\nmax_connections = -3\n'
bad_file 2 2 limits.max_connections "out of range" '[limits]\nmax_connections = 0\n'
bad_file 2 2 limits.max_connections "too large" '[limits]\nmax_connections = 99999999999999999999999\n'
bad_file 2 2 limits.max_connections "not a decimal" '[limits]\nmax_connections = 12abc\n'
bad_file 2 2 daemon.socket_mode "not an octal number" '[daemon]\nsocket_mode = 999\n'
bad_file 2 2 daemon.socket_mode "out of range" '[daemon]\nsocket_mode = 04755\n'
bad_file 2 2 daemon.backend "not one of" '[daemon]\nbackend = gpu\n'
bad_file 2 2 daemon.legacy_ipc "not a boolean" '[daemon]\nlegacy_ipc = maybe\n'
bad_file 2 2 daemon.log_level "not a log level" '[daemon]\nlog_level = loud\n'
bad_file 2 2 daemon.log_level "out of range" '[daemon]\nlog_level = 8\n'
bad_file 2 2 daemon.socket "not an absolute path" '[daemon]\nsocket = relative.sock\n'
bad_file 2 2 daemon.socket "must not be empty" '[daemon]\nsocket =\n'
bad_file 2 2 daemon.socket "longer than" "[daemon]\nsocket = /$(printf 'x%.0s' {1..120})\n"
bad_file 2 2 limits.max_segment_size "not a size" '[limits]\nmax_segment_size = 4X\n'
# a socket path past sun_path: why the limit, and what to do
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --socket "/tmp/$(printf 'z%.0s' $(seq 120))/s" || true
expect_err "key 'daemon.socket': longer than 107 bytes, what a Unix socket's address holds: give a shorter path"
# a line past libinih's 197 bytes: what to do instead (it said only that)
printf '[metrics]\ntextfile = /%s\n' "$(printf 'a%.0s' $(seq 250))" >"$tmp/long.conf"
run 2 "$gshmd" --check-config --config "$tmp/long.conf" || true
expect_err "long.conf:2: line longer than 197 bytes (give a longer value with --set SECTION.KEY=VALUE"
bad_file 2 2 limits.max_segment_size "too large" '[limits]\nmax_segment_size = 99999999T\n'
bad_file 2 2 limits.max_packet "out of range" '[limits]\nmax_packet = 4G\n'

# Malformed lines: the first error wins, with its line.
printf '[daemon]\nthis line has no equals sign\nbogus = 1\n' >"$tmp/syntax.conf"
run 2 "$gshmd" --check-config --config "$tmp/syntax.conf" || true
expect_err "$tmp/syntax.conf:2: syntax error"

# Errors in a drop-in name the drop-in.
mkdir -p "$tmp/withbad/conf.d"
printf '[daemon]\n' >"$tmp/withbad/gshmd.conf"
printf '[limits]\n\nmax_name = huge\n' >"$tmp/withbad/conf.d/50-x.conf"
run 2 "$gshmd" --check-config --config "$tmp/withbad/gshmd.conf" || true
expect_err "$tmp/withbad/conf.d/50-x.conf:3: key 'limits.max_name'"

# Limits where one list item with the longest name cannot fit in a reply
# are refused (issue 15 item 7); the figures say what would fit.
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --set limits.max_packet=4096 \
  --set limits.max_name=4095 || true
expect_err "limits.max_name 4095"
expect_err "names up to 2992 fit"
run 0 "$gshmd" --check-config --config "$tmp/good.conf" --set limits.max_packet=4096 \
  --set limits.max_name=2992 || true

# An explicit --config that is missing is an error; usage errors exit 2.
run 1 "$gshmd" --check-config --config "$tmp/missing.conf" || true
expect_err "$tmp/missing.conf"
expect_err "No such file or directory"
run 2 "$gshmd" --no-such-flag || true
expect_err "unrecognized option '--no-such-flag'"
run 2 "$gshmd" --config || true
expect_err "requires an argument"
run 2 "$gshmd" --check-config --config "$tmp/good.conf" stray-argument || true
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --set daemon.nope=1 || true
expect_err "unknown key 'daemon.nope'"
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --set not-a-key || true
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --log-level 9 || true
expect_err "'daemon.log_level'"
run 2 "$gshmd" --check-config --config "$tmp/good.conf" --backend gpu || true
GSHM_SOCKET=relative run 2 "$gshmd" --check-config --config "$tmp/good.conf" || true
expect_err "\$GSHM_SOCKET"

# --- precedence: defaults < file < conf.d (lexical) < $GSHM_SOCKET < flags ----

d="$tmp/prec"
mkdir -p "$d/conf.d/ignored-dir.conf"
cat >"$d/gshmd.conf" <<'EOF'
[daemon]
socket = /file.sock
backend = cuda
log_level = 3
[limits]
max_inflight = 5
max_name = 100
EOF
printf '[daemon]\nsocket = /dropin.sock\nlog_level = 4\n' >"$d/conf.d/10-first.conf"
printf '[daemon]\nlog_level = 5\n[limits]\nmax_name = 200\n' >"$d/conf.d/20-second.conf"
printf '[daemon]\nlog_level = 1\n' >"$d/conf.d/15-not-conf.txt"
printf '[daemon]\nlog_level = 1\n' >"$d/conf.d/.30-hidden.conf"

expect_value limits max_inflight 5 --config "$d/gshmd.conf"     # file only
expect_value daemon backend cuda --config "$d/gshmd.conf"
expect_value daemon socket /dropin.sock --config "$d/gshmd.conf" # conf.d over file
expect_value daemon log_level 5 --config "$d/gshmd.conf"         # 20- after 10-, *.conf only
expect_value limits max_name 200 --config "$d/gshmd.conf"
expect_value limits max_connections 4096 --config "$d/gshmd.conf" # default
GSHM_SOCKET=/env.sock expect_value daemon socket /env.sock --config "$d/gshmd.conf"
GSHM_SOCKET=/env.sock expect_value daemon socket /flag.sock --config "$d/gshmd.conf" --socket /flag.sock
GSHM_SOCKET=/env.sock expect_value daemon socket /flag.sock --socket /flag.sock --config "$d/gshmd.conf"
expect_value daemon socket /set.sock --config "$d/gshmd.conf" --set daemon.socket=/set.sock
# the files' own socket lost to $GSHM_SOCKET is said (a shell that exported
# one gshmd's path for gshmctl started a second gshmd on it, silently);
# nothing where a flag decides, the two agree, or no file names one
GSHM_SOCKET=/env.sock run 0 "$gshmd" --check-config --config "$d/gshmd.conf" || true
expect_err "warning: \$GSHM_SOCKET (/env.sock) overrides daemon.socket = /dropin.sock of the"
expect_err "unset GSHM_SOCKET for this gshmd, or give --socket PATH"
for quiet in "--socket /flag.sock" "--set daemon.socket=/set.sock"; do
  GSHM_SOCKET=/env.sock run 0 "$gshmd" --check-config --config "$d/gshmd.conf" $quiet || true
  if grep -q warning "$tmp/err"; then fail "a warning with $quiet: $(cat "$tmp/err")"; fi
done
GSHM_SOCKET=/dropin.sock run 0 "$gshmd" --check-config --config "$d/gshmd.conf" || true
if grep -q warning "$tmp/err"; then
  fail "a warning where \$GSHM_SOCKET agrees: $(cat "$tmp/err")"
fi
printf '[daemon]\nbackend = host\n' >"$tmp/nosocket.conf"
GSHM_SOCKET=/env.sock run 0 "$gshmd" --check-config --config "$tmp/nosocket.conf" || true
if grep -q warning "$tmp/err"; then fail "a warning without a file's socket: $(cat "$tmp/err")"; fi
expect_value daemon backend host --config "$d/gshmd.conf" --backend host
expect_value daemon log_level 7 --config "$d/gshmd.conf" --log-level 7
expect_value daemon log_level 2 --config "$d/gshmd.conf" --log-level 7 --set daemon.log_level=crit
expect_value daemon legacy_ipc true --config "$d/gshmd.conf" --legacy-ipc

# --check-config says which files it read: an admin whose file is not the
# one this build reads (README: the path follows the install prefix) sees
# the defaults named, not a bare "ok"
run 0 "$gshmd" --check-config --config "$d/gshmd.conf" || true
[[ $(cat "$tmp/out") == "gshmd: configuration ok (read $d/gshmd.conf and 2 drop-ins from its conf.d)" ]] \
  || fail "--check-config with drop-ins printed '$(cat "$tmp/out")'"
def=$("$gshmd" --help | grep -o '/[^ ,]*/gshmd\.conf' | head -1)
if [[ -n $def && ! -e $def ]]; then
  run 0 "$gshmd" --check-config || true
  [[ $(cat "$tmp/out") == "gshmd: configuration ok ($def is missing: the built-in defaults)" ]] \
    || fail "--check-config without $def printed '$(cat "$tmp/out")'"
fi

# A relative --config finds its conf.d relative to itself.
(cd "$d" && expect_value daemon socket /dropin.sock --config gshmd.conf)

# Indentation is not a continuation line (inih's multi-line values): each
# indented key keeps its own value.
printf '[daemon]\nsocket = /indent.sock\n    log_level = 6\n\t backend = host\n' >"$tmp/indent.conf"
expect_value daemon socket /indent.sock --config "$tmp/indent.conf"
expect_value daemon log_level 6 --config "$tmp/indent.conf"
expect_value daemon backend host --config "$tmp/indent.conf"

# A '#' after a blank ends the value (a trailing comment), not inside it.
printf '[daemon]\nsocket = /c.sock  # where\nsocket_group = root\t# who\nlog_level = 6 #n\n' >"$tmp/comment.conf"
expect_value daemon socket /c.sock --config "$tmp/comment.conf"
expect_value daemon socket_group root --config "$tmp/comment.conf"
expect_value daemon log_level 6 --config "$tmp/comment.conf"

# --check-config finds what would stop gshmd at start: a metrics listener
# that is not a loopback ADDRESS:PORT, an admin group that does not exist.
run 2 "$gshmd" --check-config --set metrics.http_listen=garbage
run 2 "$gshmd" --check-config --set metrics.http_listen=0.0.0.0:9477
run 0 "$gshmd" --check-config --set metrics.http_listen=127.0.0.1:9477
run 2 "$gshmd" --check-config --set daemon.admin_group=no-such-group-gshm
# A socket group that does not exist: refused by --check-config, and gshmd
# does not start (a socket of its own group would let nobody meant in).
run 2 "$gshmd" --check-config --set daemon.socket_group=no-such-group-gshm
grep -q "socket_group 'no-such-group-gshm': no such group" "$tmp/err" ||
  fail "no socket_group error: $(cat "$tmp/err")"
run 1 timeout 10 "$gshmd" --backend host --socket "$tmp/grp.sock" \
  --set daemon.socket_group=no-such-group-gshm || true
grep -q "no such group" "$tmp/err" || fail "gshmd started without its socket group: $(cat "$tmp/err")"
[[ ! -e $tmp/grp.sock ]] || fail "a socket was left at $tmp/grp.sock"
# A socket group gshmd may not give (no CAP_CHOWN, not a member), as under
# gshmd.service (CapabilityBoundingSet=, SystemCallFilter=~@privileged) when
# gshmd binds its own socket: it does not start and says why (it warned and
# served on a socket of its own group, which let nobody meant in).
other_group=$(getent group | awk -F: -v mine=" $(id -G) " 'index(mine, " " $3 " ") == 0 { print $1; exit }')
if [[ -n $other_group ]] && { [[ $(id -u) != 0 ]] || command -v setpriv >/dev/null; }; then
  no_chown=()
  [[ $(id -u) != 0 ]] || no_chown=(setpriv --bounding-set=-chown --inh-caps=-chown)
  run 1 timeout 10 "${no_chown[@]}" "$gshmd" --config /dev/null --backend host \
    --socket "$tmp/grp.sock" --set "daemon.socket_group=$other_group" || true
  grep -q "daemon.socket_group '$other_group': chown .*: Operation not permitted (.*CAP_CHOWN" \
    "$tmp/err" || fail "no chown error for socket_group $other_group: $(cat "$tmp/err")"
  grep -q "gshmd.socket" "$tmp/err" || fail "the chown error does not point at gshmd.socket"
  [[ ! -e $tmp/grp.sock ]] || fail "a socket was left at $tmp/grp.sock"
fi
# A socket directory on a read-only file system, as /run is under
# gshmd.service's ProtectSystem=strict for a gshmd binding its own socket:
# the hint names that, not "run gshmd as root" (it is root there).
# Root and unshare(1) only (a read-only bind mount).
if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null; then
  mkdir "$tmp/ro"
  # shellcheck disable=SC2016
  run 1 timeout 10 unshare -m sh -c 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" &&
    exec "$@"' "$tmp/ro" "$gshmd" --config /dev/null --backend host --socket "$tmp/ro/s" || true
  if ! grep -q "Read-only file system" "$tmp/err"; then
    echo "note: no read-only bind mount here: $(tail -1 "$tmp/err")"
  else
    grep -q "ProtectSystem=strict: there gshmd.socket makes the socket" "$tmp/err" ||
      fail "a read-only socket directory: no hint at gshmd.socket: $(cat "$tmp/err")"
    grep -q "run gshmd as root" "$tmp/err" && fail "a read-only socket directory: 'run gshmd as root'"
  fi
fi

# backend = cuda where the CUDA driver does not load (this test runs
# without LD_LIBRARY_PATH's fake driver): gshmd does not start, and says
# which setting serves host segments instead
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  run 1 timeout 10 "$gshmd" --backend cuda --socket "$tmp/cuda.sock" || true
  expect_err "backend = cuda, but the CUDA backend is unavailable"
  expect_err "daemon.backend = auto or host"
fi

# A file at the socket path that is not a socket is never removed.
echo keep >"$tmp/notasock"
run 1 timeout 10 "$gshmd" --backend host --socket "$tmp/notasock" || true
grep -q "not a socket" "$tmp/err" || fail "no 'not a socket' error: $(cat "$tmp/err")"
[[ $(cat "$tmp/notasock" 2>/dev/null) == keep ]] || fail "gshmd removed a regular file at its socket path"

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok: ${#keys[@]} keys, $n bad files"
