#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gshm-bench stopped by SIGTERM, SIGINT or SIGHUP mid-run: every process it
# started (its own gshmd, its client processes) is gone when it exits, and
# it dies by the signal ($? 128 + the signal).  A SIGHUP it was started with ignored (nohup)
# stays ignored.  Found: `gshm-bench control` killed by SIGTERM left its
# gshmd and its clients running.  Nor is any temporary directory it made
# (its gshmd's, under TMPDIR) left behind.  SIGKILLed, it cannot clean up,
# but its gshmd and clients still end (they were left running under init).
#
# usage: test_bench_signal.sh GSHM_BENCH GSHMD
set -u
bench=$1
gshmd=$2

dir=$(mktemp -d)
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# every process whose command line names $dir (the gshmd the bench
# started has its socket there: it inherits TMPDIR=$dir)
named_pids() {
  local p c
  for p in /proc/[0-9]*; do
    c=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $c == *"$dir/"* ]] && echo "${p#/proc/}"
  done
}
# children PID: the live (not zombie) children of PID, from /proc/*/stat
# (state and ppid follow the last ')', after the name)
children() {
  local p s f
  for p in /proc/[0-9]*; do
    read -r s <"$p/stat" 2>/dev/null || continue
    f=(${s##*) })
    [ "${f[1]}" = "$1" ] && [ "${f[0]}" != Z ] && echo "${p#/proc/}"
  done
}
tree() { # tree PID: PID's descendants, all levels
  local kid
  for kid in $(children "$1"); do
    echo "$kid"
    tree "$kid"
  done
}
alive() { # alive PID: running, not a zombie
  local s
  read -r s <"/proc/$1/stat" 2>/dev/null || return 1
  s=${s##*) }
  [ "${s%% *}" != Z ]
}
cleanup() {
  local p
  for p in $(named_pids); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

set -m # background jobs keep SIGINT (a script's jobs ignore it otherwise)

# round SIG WANT_RC [IGNORE]: starts the control bench, waits until its
# gshmd serves and its two clients run, sends SIG, wants exit WANT_RC and
# nothing of it left.  IGNORE: SIG is ignored when the bench starts.
round() {
  local sig=$1 want=$2 ignore=${3:-} pid rc pids p c sock="" n
  if [ -n "$ignore" ]; then
    (trap '' "$sig"; TMPDIR=$dir exec "$bench" control --clients 2 --ops stat --no-floor \
       --warmup 0 --duration 120 --gshmd "$gshmd" >"$dir/out" 2>"$dir/err") &
  else
    TMPDIR=$dir "$bench" control --clients 2 --ops stat --no-floor --warmup 0 --duration 120 \
      --gshmd "$gshmd" >"$dir/out" 2>"$dir/err" &
  fi
  pid=$!
  for _ in $(seq 400); do
    sock=$(ls "$dir"/gshm.*/gshmd.sock "$dir"/gshm-bench.*/gshm.*/gshmd.sock 2>/dev/null | head -1)
    n=0
    for p in $(tree "$pid"); do
      read -r c <"/proc/$p/comm" 2>/dev/null && [ "$c" = gshm-bench ] && n=$((n + 1))
    done
    [ -n "$sock" ] && [ "$n" -ge 2 ] && break
    sleep 0.05
  done
  pids=$(tree "$pid")
  if [ -z "$sock" ] || [ -z "$(named_pids)" ]; then
    fail "$sig: no gshmd of the bench came up ($(cat "$dir/err"))"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return
  fi
  [ -n "$ignore" ] && kill -s "$sig" "$pid" && sig=TERM && want=143
  kill -s "$sig" "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" = "$want" ] || fail "SIG$sig${ignore:+ (HUP ignored)}: exit $rc, want $want"
  if [ "$sig" = KILL ]; then # its processes end after it, not before: give them 10 s
    for _ in $(seq 200); do
      n=0
      for p in $pids; do alive "$p" && n=$((n + 1)); done
      [ "$n" = 0 ] && break
      sleep 0.05
    done
  fi
  for p in $pids; do
    if alive "$p"; then
      fail "SIG$sig: process $p ($(tr '\0' ' ' <"/proc/$p/cmdline")) outlived gshm-bench"
      kill -9 "$p"
    fi
  done
  p=$(named_pids)
  [ -z "$p" ] || fail "SIG$sig: still running with $dir: $p"
  for p in $(named_pids); do kill -9 "$p" 2>/dev/null; done
  p=$(ls -A "$dir" | grep -vx -e out -e err)
  [ "$sig" = KILL ] || [ -z "$p" ] || fail "SIG$sig: left in its TMPDIR: $p"
  rm -rf "$dir"/gshm.* "$dir"/gshm-bench.*
}

round TERM 143
round INT 130
round HUP 129
round HUP 143 ignored
round KILL 137

# Python's view of the same stop: a death by SIGTERM (returncode -15), not
# an exit 143 (bash ends a loop at a ^C only for a death); and started with
# SIGCHLD ignored, a short run still ends (the kernel reaped the benchmark
# unseen and gshm-bench waited forever).  Found in review22.
python3 - "$bench" "$gshmd" "$dir" <<'PY' || fail "python checks (above)"
import glob, os, signal, subprocess, sys, time
bench, gshmd, d = sys.argv[1:4]
env = dict(os.environ, TMPDIR=d)
args = [bench, "control", "--clients", "2", "--ops", "stat", "--no-floor", "--warmup", "0",
        "--gshmd", gshmd]
ok = True
p = subprocess.Popen(args + ["--duration", "120"], env=env, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
for _ in range(400):
    if glob.glob(d + "/gshm.*/gshmd.sock") + glob.glob(d + "/gshm-bench.*/gshm.*/gshmd.sock"):
        break
    time.sleep(0.05)
time.sleep(0.3)
p.send_signal(signal.SIGTERM)
rc = p.wait(timeout=60)
if rc != -signal.SIGTERM:
    print("FAIL: SIGTERM: returncode %d, want %d (a death by the signal)" % (rc, -signal.SIGTERM))
    ok = False
def ignore_chld():
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
t0 = time.monotonic()
try:
    rc = subprocess.run(args + ["--duration", "1"], env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, preexec_fn=ignore_chld, timeout=90).returncode
except subprocess.TimeoutExpired:
    rc = "hung (90 s)"
if rc != 0:
    print("FAIL: started with SIGCHLD ignored: %s, want 0" % rc)
    ok = False
sys.exit(0 if ok else 1)
PY
p=$(ls -A "$dir" | grep -vx -e out -e err)
[ -z "$p" ] || fail "the python runs left in their TMPDIR: $p"

[ "$failures" = 0 ] && echo "all checks passed"
exit $((failures > 0))
