#!/usr/bin/env bash
# rkv GET and PUT on real Soft-RoCE against perftest's ib_read_lat and
# ib_write_lat, same sizes, from one boot of the rxe VM (make bench-rxe).
# Writes a markdown table to OUT (default docs/bench/rxe.md), which
# docs/BENCHMARKS.md includes. Run from the repository root:
#   bash deploy/rxevm/bench-rxe.sh [OUT]
#
# In the VM: one rkv-server (verbs provider) on rxe1, rkv-client bench on
# rxe0 with one request in flight, perftest between the same devices, and
# the same shapes on the bare provider (rdma/verbs' BenchmarkRead and
# BenchmarkWriteSendReply: a READ, and a WRITE and SEND answered by a
# SEND), measured back to back, RKV_RXE_RUNS times (default 3) in the
# same boot, the order alternating from run to run. perftest busy-polls;
# rkv's processes, and the bare provider's PUT shape, poll for up to 1 ms
# (--verbs-spin 1ms, the benchmark's "spin" mode) before they sleep on a
# completion channel: under the emulation an answer takes 0.1-1 ms, where
# on a NIC it takes microseconds (rkv-client's default spin is 20us,
# rkv-server's 0). Each ratio is taken within a run; the table gives the
# median over the runs and, in parentheses, the lowest and highest. rkv's
# latencies are round trips; ib_write_lat reports half of one, so the
# table doubles it. The VM is emulated (TCG): absolute numbers are far
# slower than hardware and move from one boot to the next, the ratios are
# the point.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/bench/rxe.md}
GO=${GO:-go}

"$GO" build -tags verbs -o bin/verbs/ ./cmd/rkv-server ./cmd/rkv-client
"$GO" test -tags verbs -c -o bin/verbs/verbs.test ./rdma/verbs
bash deploy/rxevm/prepare.sh >/dev/null
mkdir -p "$(dirname "$out")"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

runs=${RKV_RXE_RUNS:-3}
[[ $runs =~ ^[1-9][0-9]?$ ]] || { echo "bench-rxe: RKV_RXE_RUNS=$runs: want 1 to 99" >&2; exit 2; }

# Prints a line "SIZE RECORD RUN GET READ PUT WRITE PREAD PPUT" (microseconds) per size and run:
# rkv, perftest, then the bare provider.
# shellcheck disable=SC2016 # expanded inside the VM
bash deploy/rxevm/run.sh --rxe 2 --timeout $((600 + 400 * runs)) --env "BENCH_BIN=$PWD/bin/verbs" --env "RKV_RXE_RUNS=$runs" -- bash -c '
set -euo pipefail
IFS=, read -r -a devs <<<"$RKV_RXE_DEVICES"
IFS=, read -r -a addrs <<<"$RKV_RXE_ADDRS"
gid=$RKV_RXE_GID_INDEX
runs=$RKV_RXE_RUNS
state=$(mktemp -d)
unset RKV_RXE_DEVICES RKV_RXE_ADDRS RKV_RXE_GID_INDEX RKV_RXE_NETDEVS RKV_RXE_VM RKV_RXE_RUNS # set for this script, not rkv flags
"$BENCH_BIN/rkv-server" --name s1 --data-dir "$state/s1" --provider verbs --device "${devs[1]}" --bootstrap --replicas 1 \
	--gossip-addr "${addrs[1]}:7946" --control-addr "${addrs[1]}:7950" --sync none --verbs-spin 1ms \
	--arena-size 64MiB --arena-count 1 --index-slots 4096 --lease-size 1MiB >"$state/log" 2>&1 &
srv=$!
trap "kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf $state" EXIT
for _ in $(seq 300); do grep -q "arenas registered" "$state/log" && break; sleep 0.2; done
grep -q "arenas registered" "$state/log" || { echo "rkv-server did not come up:" >&2; tail "$state/log" >&2; exit 1; }
cli=("$BENCH_BIN/rkv-client" --provider verbs --device "${devs[0]}" --bind "${addrs[0]}:0" --join "${addrs[1]}:7946" --timeout 60s --conns 1 --verbs-spin 1ms)
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
	[[ -n $v ]] || { echo "bench-rxe: $1 -s $2 gave no result" >&2; exit 1; }
	echo "$v"
}
rkv() { # SIZE: "GET PUT", p50 usec
	local common=(--keys 200 --value-size "$1" --concurrency 1 --distribution uniform --prefix "s$1/" --quiet --output json)
	local put get
	put=$("${cli[@]}" bench --workload put --ops 2000 "${common[@]}" | p50 put)
	get=$("${cli[@]}" bench --workload c --no-load --ops 4000 --warmup 1s "${common[@]}" | p50 get)
	[[ -n $put && -n $get ]] || { echo "bench-rxe: rkv-client bench at $1 B gave no result" >&2; exit 1; }
	echo "$get $put"
}
# provider: "SIZE PREAD PPUT" per size, p50 usec, from the bare provider: its benchmarks of
# the same shapes, waiting as rkv does (a READ completes within its post under rxe, so its wait
# needs no spin).
provider() {
	local out size rd wr
	out=$("$BENCH_BIN/verbs.test" -test.run "^$" -test.bench "^Benchmark(Read|WriteSendReply)$/cross/(wait|spin)/(64B|1KiB|64KiB)$" -test.benchtime 500x 2>&1)
	for size in 64B:64 1KiB:1024 64KiB:65536; do
		rd=$(grep "^BenchmarkRead/cross/wait/${size%%:*}-" <<<"$out" | grep -o "[0-9.]* p50-µs" | cut -d" " -f1)
		wr=$(grep "^BenchmarkWriteSendReply/cross/spin/${size%%:*}-" <<<"$out" | grep -o "[0-9.]* p50-µs" | cut -d" " -f1)
		[[ -n $rd && -n $wr ]] || { echo "bench-rxe: the provider benchmarks at ${size%%:*} gave no result:" >&2; echo "$out" >&2; exit 1; }
		echo "${size#*:} $rd $wr"
	done
}
for run in $(seq "$runs"); do
	((run % 2)) || floors=$(provider)
	rows=()
	for size in 64 1024 65536; do
		pre="s$size/"
		rec=$((size + 32 + ${#pre} + 3)) # record header, key (prefix + up to 3 digits), value
		if ((run % 2)); then
			got=$(rkv "$size")
			rd=$(perf ib_read_lat "$rec")
			wr=$(perf ib_write_lat "$rec")
		else
			rd=$(perf ib_read_lat "$rec")
			wr=$(perf ib_write_lat "$rec")
			got=$(rkv "$size")
		fi
		read -r get put <<<"$got"
		rows+=("$size $rec $run $get $rd $put $wr")
		echo "bench-rxe: run $run of $runs, $size B: GET $get us, ib_read_lat $rd us, PUT $put us, ib_write_lat $wr us" >&2
	done
	((run % 2)) && floors=$(provider)
	for row in "${rows[@]}"; do
		read -r size _ <<<"$row"
		floor=$(grep "^$size " <<<"$floors" | cut -d" " -f2-)
		echo "$row $floor"
		echo "bench-rxe: run $run of $runs, $size B: the bare provider: READ and PUT shape $floor us" >&2
	done
done
' >"$tmp"
[[ $(wc -l <"$tmp") -eq $((3 * runs)) ]] || { echo "bench-rxe: the VM run did not produce every row" >&2; exit 1; }

# spread EXPRESSION SIZE: the median over the runs and, with more
# than one, the lowest and highest, of an awk expression of a row's fields.
spread() {
	awk -v s="$2" "\$1 == s { print $1 }" "$tmp" | sort -g | awk '
		function f(v) { return v >= 100 ? sprintf("%.0f", v) : sprintf("%.3g", v) }
		{ x[NR] = $1 }
		END {
			m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
			if (NR == 1) printf "%s", f(m)
			else printf "%s (%s-%s)", f(m), f(x[1]), f(x[NR])
		}'
}
{
	echo "Measured $(date -u +%Y-%m-%d) by \`make bench-rxe\` (deploy/rxevm/bench-rxe.sh): one rkv-server"
	echo "(verbs provider, \`--sync none --verbs-spin 1ms\`) on rxe1, \`rkv-client --conns 1 --verbs-spin 1ms bench"
	echo "--concurrency 1\` on rxe0,"
	echo "perftest between the same two devices with the record's size (key + value + 32-byte header),"
	echo "in one qemu VM under software emulation (TCG). A warm GET is one RDMA_READ of the record;"
	echo "a PUT is an RDMA_WRITE and the commit as a SEND after it on the same QP, answered by a SEND"
	echo "(one round trip). ib_write_lat reports half a round trip, so the table doubles it. perftest"
	echo "busy-polls; both rkv processes poll for up to 1 ms before they sleep on a completion channel"
	echo "(\`--verbs-spin\`; under the emulation an answer takes 0.1-1 ms, on a NIC microseconds). The"
	echo "provider columns are the same shapes on rdma/verbs alone, waiting as rkv does: a READ"
	echo "(\`BenchmarkRead\`), and a WRITE and a 64-byte SEND answered by a 64-byte SEND"
	echo "(\`BenchmarkWriteSendReply\`, spinning 1 ms), with the value's size; what rkv adds is the"
	echo "last column."
	echo "Each size was measured $runs times in the same boot, rkv and perftest back to back (the order"
	echo "alternating from run to run): each ratio is taken within a run, and the table gives the median"
	echo "over the runs, with the lowest and highest in parentheses. Latencies are p50s (perftest's"
	echo "\"typical\"), in microseconds; the emulation's speed moves them from one boot to the next."
	echo
	echo "| value (B) | record (B) | rkv GET p50 (us) | ib_read_lat (us) | GET ratio | provider READ (us) | rkv PUT p50 (us) | 2 x ib_write_lat (us) | PUT ratio | provider PUT shape (us) | rkv PUT / provider |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for size in 64 1024 65536; do
		rec=$(awk -v s="$size" '$1 == s { print $2; exit }' "$tmp")
		echo "| $size | $rec | $(spread '$4' "$size") | $(spread '$5' "$size") | $(spread '$4 / $5' "$size") | $(spread '$8' "$size") | $(spread '$6' "$size") | $(spread '2 * $7' "$size") | $(spread '$6 / (2 * $7)' "$size") | $(spread '$9' "$size") | $(spread '$6 / $9' "$size") |"
	done
} >"$out"
echo "bench-rxe: wrote $out"
