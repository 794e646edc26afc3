#!/usr/bin/env bash
# Prints perftest's ib_read_lat/ib_write_lat and rdma/verbs' READ/WRITE
# latency benchmarks, and the PUT's shape on the bare provider
# (BenchmarkWriteSendReply), side by side, from one boot of the rxe VM, between rxe0
# and rxe1 (same sizes). Run from the repository root:
#   bash deploy/rxevm/latency.sh [path/to/verbs.test]
# perftest's ib_write_lat reports half a round trip; ours are round trips.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEST=${1:-bin/verbs.test}
[ -x "$TEST" ] || { echo "latency.sh: $TEST not built (go test -tags verbs -c -o $TEST ./rdma/verbs/)" >&2; exit 2; }

# shellcheck disable=SC2016 # expanded inside the VM
exec bash "$HERE/run.sh" --rxe 2 --timeout 900 -- bash -c '
set -u
IFS=, read -r -a devs <<<"$RKV_RXE_DEVICES"
IFS=, read -r -a addrs <<<"$RKV_RXE_ADDRS"
gid=$RKV_RXE_GID_INDEX
port=18700
perf() { # tool size: run server on rxe1, client on rxe0, print "typical" usec
	local tool=$1 size=$2
	timeout 60 "$tool" -d "${devs[1]}" -x "$gid" -s "$size" -n 2000 -F -p $port >/dev/null 2>&1 &
	sleep 0.5
	local out
	out=$(timeout 60 "$tool" -d "${devs[0]}" -x "$gid" -s "$size" -n 2000 -F -p $port "${addrs[1]}" 2>&1)
	wait
	port=$((port + 1))
	awk -v s="$size" "\$1 == s { print \$5; found=1 } END { if (!found) print \"?\" }" <<<"$out"
}
echo "== perftest, ${devs[0]} -> ${devs[1]} (typical usec; ib_write_lat is half a round trip)"
for size in 2 64 1024; do
	printf "ib_read_lat  %5s B: %s us\n" "$size" "$(perf ib_read_lat "$size")"
	printf "ib_write_lat %5s B: %s us\n" "$size" "$(perf ib_write_lat "$size")"
done
echo "== rdma/verbs, same devices (round trips; p50 per request)"
'"$TEST"' -test.run "^$" -test.bench "^Benchmark(Read|Write|WriteSendReply)$/cross/wait" -test.benchtime 2000x 2>&1 | grep -E "^Benchmark|^ok|FAIL"
'
