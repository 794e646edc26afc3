#!/usr/bin/env bash
# Runs rdmaread's server and client as two processes on the soft provider.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=bin/rdmaread
addr=127.0.0.1:${RKV_DEMO_PORT:-7470}
log=$(mktemp -t rdmaread-server.XXXXXX.log)

"$bin" serve --provider soft --addr "$addr" --size $((256 << 20)) >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT

echo "== server starting (log: $log)"
for _ in $(seq 100); do
	grep -q "memory registered" "$log" && break
	kill -0 $server 2>/dev/null || { cat "$log"; echo "server exited early"; exit 1; }
	sleep 0.1
done
cat "$log"
echo "== client: one-sided READs of random slots"
"$bin" read --provider soft --addr "$addr" --count 20000
kill $server
wait $server || true
echo "== server log after the client left"
tail -n 2 "$log"
