# SPDX-License-Identifier: Apache-2.0
# What the two-gshmd gshmctl tests share (sourced after lib.sh, with $py
# set and $exports the cluster.export rules): two gshmd on 127.0.0.1 with
# one key, node5 on $dir/n5 (pid $pid5) and node7 on $dir/n7 (pid $pid7),
# each a peer of the other, $(id -gn) their pull group; returns once both
# sockets are there.  Both are killed at exit (continued first: a test may
# have stopped one with SIGSTOP), and each must exit 0 at its SIGTERM.
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
(umask 077; head -c 32 /dev/urandom | base64 >"$dir/key")
p5=$(free_port) p7=$(free_port)
peers="cluster.peers=node5=127.0.0.1:$p5,node7=127.0.0.1:$p7"
node() { # node N PORT: a gshmd as node N on $dir/nN, its pid in $pidN
  "$gshmd" --backend host --socket "$dir/n$1" --log-level 3 --set "cluster.listen=127.0.0.1:$2" \
    --set "cluster.secret_file=$dir/key" --set "cluster.node_name=node$1" --set "$peers" \
    --set "cluster.export=$exports" --set "cluster.pull_group=$(id -gn)" \
    2>"$dir/gshmd-$1.log" &
  eval "pid$1=\$!"
}
node 5 "$p5"
node 7 "$p7"
# (each gshmd must exit 0 at its SIGTERM: a bare wait returned 0 whatever)
trap 'rc=$?; kill -CONT $pid5 $pid7 2>/dev/null; for p in $pid5 $pid7; do kill $p 2>/dev/null;
        wait $p || { echo "FAIL: gshmd $p exited $? at its SIGTERM"; rc=1; }; done
      gshmd_stop || rc=1; rm -rf "$dir"; exit $rc' EXIT
for _ in $(seq 200); do [ -S "$dir/n5" ] && [ -S "$dir/n7" ] && break; sleep 0.05; done
