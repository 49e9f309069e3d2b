#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gshmd --check-config refuses every [cluster] config that gshmd refuses
# at start, with the same message; a cluster port something else
# listens on is one clear error at start.
#
# usage: test_cluster_config.sh GSHMD
set -euo pipefail

gshmd=$1
unset GSHM_SOCKET JOURNAL_STREAM NOTIFY_SOCKET
export LC_ALL=C

tmp=$(mktemp -d)
holder=
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

head -c 32 /dev/urandom | base64 >"$tmp/key"
chmod 0600 "$tmp/key"
printf 'short-key' >"$tmp/short"
chmod 0600 "$tmp/short"
cp "$tmp/key" "$tmp/open-key"
chmod 0640 "$tmp/open-key"

# refused WHAT MESSAGE ARGS...: --check-config exits 2 and gshmd exits
# non-zero, both saying MESSAGE on stderr.
refused() {
  local what=$1 msg=$2 rc=0
  shift 2
  timeout 30 "$gshmd" --check-config "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [[ $rc != 2 ]] || ! grep -qF -- "$msg" "$tmp/err"; then
    fail "$what: --check-config exit $rc, wanted 2 and '$msg'"
    sed 's/^/  stderr: /' "$tmp/err" >&2
  fi
  rc=0
  timeout 30 "$gshmd" --backend host --set "daemon.socket=$tmp/sock" "$@" \
    >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [[ $rc == 0 || $rc == 124 ]] || ! grep -qF -- "$msg" "$tmp/err"; then
    fail "$what: gshmd exit $rc, wanted a refusal with '$msg'"
    sed 's/^/  stderr: /' "$tmp/err" >&2
  fi
}

L=(--set cluster.listen=127.0.0.1:1)
K=(--set "cluster.secret_file=$tmp/key")

refused "listen without a secret" "cluster.secret_file is required" "${L[@]}"
refused "peers without a secret" "cluster.secret_file is required" \
  --set cluster.peers=n=127.0.0.1:7470
refused "missing key" "no such file; make the key once" "${L[@]}" \
  --set "cluster.secret_file=$tmp/none"
# what to do, for each key that is not there or not a key
refused "missing key: how to make one" "head -c 32 /dev/urandom | base64 > $tmp/none" "${L[@]}" \
  --set "cluster.secret_file=$tmp/none"
refused "listen without a secret: how to make one" "head -c 32 /dev/urandom | base64 > FILE" \
  "${L[@]}"
refused "short key: its length" "at least 16 bytes, it has 9; make a random one" "${L[@]}" \
  --set "cluster.secret_file=$tmp/short"
# a link, and (as root) a key gshmd's user may not read: what the file is,
# and what to do ("Too many levels of symbolic links", "Permission denied")
ln -s "$tmp/key" "$tmp/link-key"
refused "key behind a symbolic link" "a symbolic link, which gshmd does not follow; name the file" \
  "${L[@]}" --set "cluster.secret_file=$tmp/link-key"
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
  chmod 0711 "$tmp" # nobody may reach the key (root's, 0600), not read it
  rc=0
  setpriv --reuid=65534 --regid=65534 --clear-groups "$gshmd" --check-config "${L[@]}" \
    "${K[@]}" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [[ $rc != 2 ]] || ! grep -qF "gshmd (uid 65534) may not read it: mode 0600 owned by uid 0" \
    "$tmp/err"; then
    fail "a key gshmd's user may not read: exit $rc"
    sed 's/^/  stderr: /' "$tmp/err" >&2
  fi
  chmod 0700 "$tmp"
fi
refused "short key" "at least 16 bytes" "${L[@]}" --set "cluster.secret_file=$tmp/short"
# a key file past 4096 bytes: only its first 4096 were read, the rest
# silently ignored (two files that differ only there made one key)
{
  cat "$tmp/key"
  head -c 4096 /dev/zero | tr '\0' k
} >"$tmp/long-key"
chmod 0600 "$tmp/long-key"
refused "key file past 4096 bytes" "more than 4096 bytes" "${L[@]}" \
  --set "cluster.secret_file=$tmp/long-key"
# a FIFO as the key: open(2) waited for a writer, and gshmd's start (and
# --check-config) hung there for ever
mkfifo -m 0600 "$tmp/fifo-key"
refused "key that is a FIFO" "not a regular file" "${L[@]}" --set "cluster.secret_file=$tmp/fifo-key"
refused "key readable by the group" "chmod 0600" "${L[@]}" --set "cluster.secret_file=$tmp/open-key"
# ... and says what it found (it said only what a key must be)
refused "key readable by the group: its mode" "is mode 0640" "${L[@]}" \
  --set "cluster.secret_file=$tmp/open-key"
refused "listen without a port" "cluster.listen '127.0.0.1': no ':PORT' (want ADDRESS:PORT" \
  --set cluster.listen=127.0.0.1 "${K[@]}"
refused "peer without an address" "is not NAME=ADDRESS:PORT" "${L[@]}" "${K[@]}" \
  --set cluster.peers=node7
# an address that is no ADDRESS:PORT: what is wrong with it (a peer
# without its port "cannot resolve '10.0.0.7'", a port 0 or an empty
# address "want ADDRESS:PORT")
refused "peer without a port" "peer 'node7': address '10.0.0.7': no ':PORT'" "${L[@]}" \
  "${K[@]}" --set cluster.peers=node7=10.0.0.7
refused "listen on port 0" "cluster.listen '127.0.0.1:0': PORT is not a number 1..65535" \
  --set cluster.listen=127.0.0.1:0 "${K[@]}"
refused "listen without an address" "no ADDRESS before ':PORT' (0.0.0.0:PORT is every IPv4" \
  --set cluster.listen=:7470 "${K[@]}"
refused "peer named twice" "named twice" "${L[@]}" "${K[@]}" \
  --set "cluster.peers=n=127.0.0.1:2,n=127.0.0.1:3"
refused "peer name with a control byte" "no blanks, control bytes" "${L[@]}" "${K[@]}" \
  --set "cluster.peers=a$(printf '\033')b=127.0.0.1:2"
refused "node name with a blank" "cluster.node_name" "${L[@]}" "${K[@]}" \
  --set "cluster.node_name=a b"
# a comma parts names in lists of sources and paths of relayed bytes, where
# a lone '?' is the unknown rest
refused "node name with a comma" "backslashes, not '?'" "${L[@]}" "${K[@]}" \
  --set "cluster.node_name=a,b"
refused "node name '?'" "backslashes, not '?'" "${L[@]}" "${K[@]}" --set "cluster.node_name=?"
refused "peer named '?'" "not '?'" "${L[@]}" "${K[@]}" --set "cluster.peers=?=127.0.0.1:2"
# a quote or a backslash in a name broke every scrape of the node: its
# metrics' label values (peer="b"ad") are no Prometheus text format; a
# colon parts a peer from a name (gshmctl pull PEER:NAME, a pulled
# segment's source PEER:NAME#ID.GEN): such a peer could not be pulled from
# a byte of no valid UTF-8 likewise (label values are UTF-8), and a C1
# control or a bidi override is text no name needs
for bad in 'b"ad' 'b\ad' 'c:d' "$(printf 'b\377ad')" "$(printf 'b\302\233ad')" \
  "$(printf 'b\342\200\256ad')"; do
  refused "peer named '$bad'" "no blanks, control bytes" "${L[@]}" \
    "${K[@]}" --set "cluster.peers=$bad=127.0.0.1:2"
done
refused "node name with a quote" "cluster.node_name" "${L[@]}" "${K[@]}" \
  --set 'cluster.node_name=a"b'
# which of the two it looked for (a group written without its '@' was
# "no such user or group", no hint of the '@')
refused "export of an unknown user" "no such user 'no-such-user-here' (a group is @GROUP)" \
  "${L[@]}" "${K[@]}" --set "cluster.export=llama/*:no-such-user-here"
refused "export of an unknown group" "no such group 'no-such-group-here'" "${L[@]}" "${K[@]}" \
  --set "cluster.export=llama/*:@no-such-group-here"
refused "export rule without a pattern" "want PATTERN" "${L[@]}" "${K[@]}" \
  --set "cluster.export=:root"
refused "unknown pull group" "does not exist" "${L[@]}" "${K[@]}" \
  --set cluster.pull_group=no-such-group-here

# what is accepted
rc=0
"$gshmd" --check-config "${L[@]}" "${K[@]}" --set "cluster.peers=n=127.0.0.1:2" \
  --set "cluster.export=llama/* kv/*:root kv/*:@root" >"$tmp/out" 2>"$tmp/err" || rc=$?
if [[ $rc != 0 ]] || ! grep -qF "configuration ok" "$tmp/out"; then
  fail "a good cluster config: exit $rc"
  sed 's/^/  stderr: /' "$tmp/err" >&2
fi
# ... with a key file of 4096 bytes exactly, the most
head -c 4096 "$tmp/long-key" >"$tmp/key-4096"
chmod 0600 "$tmp/key-4096"
rc=0
"$gshmd" --check-config "${L[@]}" --set "cluster.secret_file=$tmp/key-4096" >"$tmp/out" \
  2>"$tmp/err" || rc=$?
if [[ $rc != 0 ]] || ! grep -qF "configuration ok" "$tmp/out"; then
  fail "a key file of 4096 bytes: exit $rc"
  sed 's/^/  stderr: /' "$tmp/err" >&2
fi

# [cluster] keys with the cluster off do nothing: said (accepted silently before)
rc=0
"$gshmd" --check-config --set "cluster.export=llama/*" >"$tmp/out" 2>"$tmp/err" || rc=$?
if [[ $rc != 0 ]] || ! grep -qF "cluster.export is set but the cluster is off" "$tmp/err"; then
  fail "cluster.export with the cluster off: exit $rc, no warning"
  sed 's/^/  stderr: /' "$tmp/err" >&2
fi

# One peers list for every node names this node too: it is no peer of
# itself (it linked to itself, "up", before).  It keeps running (the
# timeout ends it: 124), not stopped by the list.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
rc=0
timeout 3 "$gshmd" --backend host --set "daemon.socket=$tmp/self.sock" "${K[@]}" \
  --set "cluster.listen=127.0.0.1:$port" --set cluster.node_name=n1 \
  --set "cluster.peers=n1=127.0.0.1:$port,n2=127.0.0.1:1" >"$tmp/out" 2>"$tmp/err" || rc=$?
if [[ $rc != 124 ]] || ! grep -qF "'n1' is this node" "$tmp/err" ||
   grep -q "peer 'n1' connected" "$tmp/err"; then
  fail "a node listed in its own peers: not skipped, or gshmd ended (exit $rc, 124: still running)"
  sed 's/^/  stderr: /' "$tmp/err" >&2
fi

# A port something listens on: one clear error at start.
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)' >"$tmp/port" &
holder=$!
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.1; done
port=$(cat "$tmp/port")
rc=0
timeout 30 "$gshmd" --backend host --set "daemon.socket=$tmp/sock" \
  --set "cluster.listen=127.0.0.1:$port" "${K[@]}" >"$tmp/out" 2>"$tmp/err" || rc=$?
if [[ $rc == 0 || $rc == 124 ]] || ! grep -qF "cluster.listen 127.0.0.1:$port: the port is in use" "$tmp/err"; then
  fail "port in use: exit $rc"
  sed 's/^/  stderr: /' "$tmp/err" >&2
fi

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "cluster config: ok"
