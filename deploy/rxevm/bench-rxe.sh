#!/usr/bin/env bash
# rkv GET and PUT on real Soft-RoCE against perftest's ib_read_lat and
# ib_write_lat, same sizes, from one boot of the rxe VM (make bench-rxe).
# Writes a markdown table to OUT (default docs/bench/rxe.md), which
# docs/BENCHMARKS.md includes. Run from the repository root:
#   bash deploy/rxevm/bench-rxe.sh [OUT]
#
# In the VM: one rkv-server (verbs provider) on rxe1, rkv-client bench on
# rxe0 with one request in flight; then perftest between the same devices.
# rkv's latencies are round trips; ib_write_lat reports half of one, so the
# table doubles it. The VM is emulated (TCG): absolute numbers are far
# slower than hardware, the ratios are the point.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/bench/rxe.md}
GO=${GO:-go}

"$GO" build -tags verbs -o bin/verbs/ ./cmd/rkv-server ./cmd/rkv-client
bash deploy/rxevm/prepare.sh >/dev/null
mkdir -p "$(dirname "$out")"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

# shellcheck disable=SC2016 # expanded inside the VM
bash deploy/rxevm/run.sh --rxe 2 --timeout 1200 --env "BENCH_BIN=$PWD/bin/verbs" -- bash -c '
set -euo pipefail
IFS=, read -r -a devs <<<"$RKV_RXE_DEVICES"
IFS=, read -r -a addrs <<<"$RKV_RXE_ADDRS"
gid=$RKV_RXE_GID_INDEX
state=$(mktemp -d)
unset RKV_RXE_DEVICES RKV_RXE_ADDRS RKV_RXE_GID_INDEX RKV_RXE_NETDEVS RKV_RXE_VM # set by the VM harness, not rkv flags
"$BENCH_BIN/rkv-server" --name s1 --data-dir "$state/s1" --provider verbs --device "${devs[1]}" --bootstrap --replicas 1 \
	--gossip-addr "${addrs[1]}:7946" --control-addr "${addrs[1]}:7950" --sync none \
	--arena-size 64MiB --arena-count 1 --index-slots 4096 --lease-size 1MiB >"$state/log" 2>&1 &
srv=$!
trap "kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf $state" EXIT
for _ in $(seq 300); do grep -q "arenas registered" "$state/log" && break; sleep 0.2; done
grep -q "arenas registered" "$state/log" || { echo "rkv-server did not come up:" >&2; tail "$state/log" >&2; exit 1; }
cli=("$BENCH_BIN/rkv-client" --provider verbs --device "${devs[0]}" --bind "${addrs[0]}:0" --join "${addrs[1]}:7946" --timeout 60s --conns 1)
# p50 KIND: the p50 in microseconds of KIND in a bench JSON on stdin.
p50() { tr -d " \n" | grep -o "\"$1\":{\"count\":[0-9]*,\"p50_ns\":[0-9]*" | sed "s/.*://" | awk "{ printf \"%.1f\", \$1 / 1000 }"; }
port=18800
perf() { # TOOL SIZE: typical usec, server on rxe1, client on rxe0 (3 tries: the server may start late)
	local v=
	for try in 1 2 3; do
		timeout 60 "$1" -d "${devs[1]}" -x "$gid" -s "$2" -n 2000 -F -p $port >/dev/null 2>&1 &
		sleep $try
		v=$(timeout 60 "$1" -d "${devs[0]}" -x "$gid" -s "$2" -n 2000 -F -p $port "${addrs[1]}" 2>&1 |
			awk -v s="$2" "\$1 == s { print \$5 }")
		wait || true
		port=$((port + 1))
		[[ -n $v ]] && break
	done
	echo "${v:-?}"
}
echo "| value | record (B) | rkv GET p50 | ib_read_lat | GET ratio | rkv PUT p50 | 2 x ib_write_lat | PUT ratio |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
i=0
for size in 64 1024 65536; do
	pre="s$size/"
	common=(--keys 200 --value-size "$size" --concurrency 1 --distribution uniform --prefix "$pre" --quiet --output json)
	put=$("${cli[@]}" bench --workload put --ops 2000 "${common[@]}" | p50 put)
	get=$("${cli[@]}" bench --workload c --no-load --ops 4000 --warmup 1s "${common[@]}" | p50 get)
	rec=$((size + 32 + ${#pre} + 3))  # record header, key (prefix + up to 3 digits), value
	rd=$(perf ib_read_lat "$rec")
	wr=$(perf ib_write_lat "$rec")
	awk -v v="$size" -v r="$rec" -v g="$get" -v rd="$rd" -v p="$put" -v wr="$wr" "BEGIN {
		printf \"| %d | %d | %s us | %s us | %.2f | %s us | %.1f us | %.2f |\n\", v, r, g, rd, g / rd, p, 2 * wr, p / (2 * wr) }"
done
' | tee "$tmp"
grep -q '^| 65536 ' "$tmp" || { echo "bench-rxe: the VM run did not produce every row" >&2; exit 1; }
{
	echo "Measured $(date -u +%Y-%m-%d) by \`make bench-rxe\` (deploy/rxevm/bench-rxe.sh): one rkv-server"
	echo "(verbs provider, \`--sync none\`) on rxe1, \`rkv-client bench --concurrency 1 --conns 1\` on rxe0,"
	echo "perftest between the same two devices with the record's size (key + value + 32-byte header),"
	echo "in one qemu VM under software emulation (TCG). A warm GET is one RDMA_READ of the record;"
	echo "a PUT is an RDMA_WRITE and the commit as a SEND after it on the same QP, answered by a SEND"
	echo "(one round trip). ib_write_lat reports half a round trip, so the table doubles it."
	echo
	cat "$tmp"
} >"$out"
echo "bench-rxe: wrote $out"
