#!/usr/bin/env bash
# The rxe demo, guest side: runs as root INSIDE the rxe VM that
# deploy/demo/demo-rxe.sh boots with `deploy/rxevm/run.sh --rxe 4` (make demo-rxe).
#
# One VM, default network namespace, one Soft-RoCE device per node:
#   node1..node3  rkv-server --provider verbs --device rxe0..rxe2, gossip and
#                 control on that device's IPv4 address (RKV_RXE_ADDRS[0..2])
#   client        rkv-client --provider verbs --device rxe3, gossip bound to
#                 RKV_RXE_ADDRS[3]
# Then: the scripted session of `make demo`, a GET-only phase that proves the
# reads are one-sided RDMA (rxe hw_counters move, server handlers do not), and
# a SIGTERM stop with exit status checks.
#
# Environment (set by run.sh): RKV_RXE_DEVICES, RKV_RXE_ADDRS, RKV_RXE_GID_INDEX.
# Optional: RKV_DEMO_BIN (default bin/verbs, binaries built with -tags verbs),
# RKV_DEMO_GETS (GET-only phase: separate rkv-client get processes, default 40).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${RKV_DEMO_BIN:-$PWD/bin/verbs}
gets=${RKV_DEMO_GETS:-40}
nodes=(node1 node2 node3)
arenas=2

say() { printf '\n== %s\n' "$*"; }

[[ ${RKV_RXE_VM:-} == 1 ]] || {
	echo "demo-rxe-guest.sh runs inside the rxe VM: use make demo-rxe (deploy/demo/demo-rxe.sh)" >&2
	exit 2
}
IFS=, read -r -a devs <<<"${RKV_RXE_DEVICES:?}"
IFS=, read -r -a addrs <<<"${RKV_RXE_ADDRS:?}"
[[ ${#devs[@]} -ge 4 && ${#addrs[@]} -ge 4 ]] || {
	echo "need 4 rxe devices (run.sh --rxe 4), have: ${RKV_RXE_DEVICES}" >&2
	exit 2
}
gid_index=${RKV_RXE_GID_INDEX:-1}
IFS=, read -r -a netdevs <<<"${RKV_RXE_NETDEVS:-?,?,?,?}"
# rkv-client reads RKV_* as its flags and warns about the others: the
# VM's and this script's are read above, so they go.
unset RKV_RXE_VM RKV_RXE_DEVICES RKV_RXE_ADDRS RKV_RXE_NETDEVS RKV_RXE_GID_INDEX RKV_DEMO_BIN RKV_DEMO_GETS
for b in rkv-server rkv-client; do
	[[ -x $bin/$b ]] || {
		echo "$bin/$b is missing: build with go build -tags verbs -o bin/verbs/ ./cmd/..." >&2
		exit 2
	}
done

state=$(mktemp -d /tmp/rkv-demo-rxe.XXXXXX)
declare -a pids=()
seed=${addrs[0]}:7946
cli=("$bin/rkv-client" --provider verbs --device "${devs[3]}" --bind "${addrs[3]}:0" --join "$seed" --timeout 30s)

# fail NODE-INDEX|"" MESSAGE: report, show the node's log tail, exit 1.
fail() {
	local i=$1
	shift
	echo "demo-rxe FAILED: $*" >&2
	if [[ -n $i ]]; then
		echo "-- last lines of ${nodes[$i - 1]}'s log (device ${devs[$i - 1]}, ${addrs[$i - 1]}):" >&2
		tail -n 20 "$state/${nodes[$i - 1]}.log" >&2 || true
	else
		for j in 1 2 3; do
			echo "-- last lines of ${nodes[$j - 1]}'s log:" >&2
			tail -n 6 "$state/${nodes[$j - 1]}.log" >&2 || true
		done
	fi
	exit 1
}

alive() { [[ -n ${pids[$1]:-} ]] && kill -0 "${pids[$1]}" 2>/dev/null; }

cleanup() {
	for i in 1 2 3; do alive "$i" && kill -KILL "${pids[$i]}" 2>/dev/null; done
	rm -rf "$state"
}
trap cleanup EXIT

# wait_log I PATTERN WHAT SECS: wait for node I's log to match PATTERN.
wait_log() {
	local i=$1 pat=$2 what=$3 secs=$4 name=${nodes[$1 - 1]}
	local deadline=$((SECONDS + secs))
	until grep -q "$pat" "$state/$name.log"; do
		alive "$i" || fail "$i" "$name exited while waiting for: $what"
		((SECONDS < deadline)) || fail "$i" "$name: no \"$what\" after ${secs}s"
		sleep 0.2
	done
}

# shellcheck source=deploy/demo/session.sh
source "$(dirname "${BASH_SOURCE[0]}")/session.sh"

# counters DEV: "name=value ..." of the device's port-1 hw_counters.
hw() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2" 2>/dev/null || echo 0; }

# requests: the servers' handled-request counters, "node1 N\nnode2 N\n..."
requests() {
	"${cli[@]}" --output json status | tr -d ' \n' | grep -o '"name":"[^"]*"\|"control_requests":[0-9]*' |
		sed 's/"name":"\(.*\)"/\1/; s/"control_requests"://' | paste - -
}

# others: per node, the control requests it handled other than connection
# setup (Hello), map fetches (GetMap), status (Stats) and the servers' own
# read lease renewals with the map's leader (RenewReadLease, one per server
# a second): what a GET served by a handler would add to.
others() {
	"${cli[@]}" --output json status | tr -d ' \n' | grep -o '"name":"[^"]*"\|"requests_by_type":{[^}]*}' |
		sed 's/"name":"\(.*\)"/\1/; s/"requests_by_type":{\(.*\)}/\1/' | paste - - |
		awk -F'\t' '{ n = 0; k = split($2, kv, ","); for (i = 1; i <= k; i++) { split(kv[i], p, ":"); t = p[1]; gsub(/"/, "", t);
			if (t != "Hello" && t != "GetMap" && t != "Stats" && t != "RenewReadLease") n += p[2] } print $1, n }'
}

t0=$SECONDS
say "4 Soft-RoCE devices in one VM (default namespace, veth pairs on a bridge)"
printf '  %-7s %-6s %-7s %-12s %s\n' NODE DEVICE NETDEV IP "GID[$gid_index]"
for i in 0 1 2 3; do
	name=client
	[[ $i -lt 3 ]] && name=${nodes[$i]}
	gid=$(cat "/sys/class/infiniband/${devs[$i]}/ports/1/gids/$gid_index" 2>/dev/null || echo '?')
	printf '  %-7s %-6s %-7s %-12s %s\n' "$name" "${devs[$i]}" "${netdevs[$i]:-?}" "${addrs[$i]}" "$gid"
done

say "starting 3 rkv-server processes (verbs provider, one rxe device each)"
for i in 1 2 3; do
	name=${nodes[$i - 1]} ip=${addrs[$i - 1]} join=(--bootstrap --replicas 1) # one copy: this demo shows the verbs data path; make demo shows R=3
	[[ $i -gt 1 ]] && join=(--join "$seed")
	echo "  $name: --provider verbs --device ${devs[$i - 1]} --gossip-addr $ip:7946 --control-addr $ip:7950"
	"$bin/rkv-server" --name "$name" --data-dir "$state/$name" --provider verbs --device "${devs[$i - 1]}" \
		--gossip-addr "$ip:7946" --control-addr "$ip:7950" "${join[@]}" \
		--arena-size 16MiB --arena-count "$arenas" --registration-unit 4MiB --index-slots 16384 --lease-size 1MiB \
		>"$state/$name.log" 2>&1 &
	pids[i]=$!
	# The others join through node1: it must serve first.
	if [[ $i -eq 1 ]]; then wait_log 1 'msg=ready' ready 60; fi
done
for i in 1 2 3; do
	wait_log "$i" 'msg=ready' ready 60
	echo "  ${nodes[$i - 1]} ready ($((SECONDS - t0))s)"
done
for i in 1 2 3; do
	wait_log "$i" 'msg="arenas registered"' "arenas registered" 90
	echo "  ${nodes[$i - 1]}: $arenas arenas registered ($((SECONDS - t0))s)"
done
printf '  waiting for the client view: 3 servers, %d arenas each...' "$arenas"
ok=0
for try in 1 2 3; do
	if out=$("${cli[@]}" members --expect-servers 3 --expect-arenas "$arenas" 2>&1); then
		ok=1
		break
	fi
	printf ' (attempt %d: %s)' "$try" "$(tail -n 1 <<<"$out")"
done
[[ $ok -eq 1 ]] || {
	echo
	fail "" "the view did not converge to 3 servers with $arenas arenas each"
}
echo " converged ($((SECONDS - t0))s)"

say "the nodes as the cluster sees them (endpoint = the GID each server advertises)"
export RKV_OUTPUT=json
mjson=$("${cli[@]}" members)
unset RKV_OUTPUT
for i in 1 2 3; do
	ep=$(tr -d '\n' <<<"$mjson" | grep -o "\"name\": *\"${nodes[$i - 1]}\"[^}]*" | grep -o '"endpoint": *"[^"]*"' | sed 's/.*: *"//; s/"$//')
	printf '  %-6s %-5s %-12s advertised endpoint: %s\n' "${nodes[$i - 1]}" "${devs[$i - 1]}" "${addrs[$i - 1]}" "${ep:-?}"
	[[ $ep == *"${addrs[$i - 1]}"* ]] || fail "$i" "${nodes[$i - 1]} advertises endpoint \"$ep\", not the GID of ${addrs[$i - 1]}"
done

say "a session through rkv-client on ${devs[3]} (${addrs[3]})"
demo_session

say "arenas registered in units: each 16 MiB arena is 4 regions of 4 MiB, each its own MR and rkey"
# Fill more than the first unit of every server (segments are carved in
# order, the first from the first unit), so that the values written and
# read next lie in units at an offset into their arena.
units=$("${cli[@]}" --output json members | grep -o '"offset": *[0-9]*' | grep -vc '"offset": *0$' || true)
echo "  regions advertised at a nonzero offset into their arena: $units (3 servers x $arenas arenas x 3)"
((units == 3 * arenas * 3)) || fail "" "$units regions at a nonzero offset advertised, want $((3 * arenas * 3))"
echo "\$ rkv-client bench --workload put --no-load --distribution uniform --keys 120 --ops 120 --value-size 200000 --prefix fill/ --quiet"
"${cli[@]}" bench --workload put --no-load --distribution uniform --keys 120 --ops 120 --value-size 200000 --concurrency 4 --prefix fill/ --quiet |
	sed 's/^/  /' || fail "" "filling the first units failed"

say "is the data path one-sided RDMA? $gets GET-only rkv-client processes"
# Keys to read: written once here (bench: puts then gets, not measured).
echo "\$ rkv-client bench --keys $gets --ops $gets --distribution uniform --verify --value-size 256 --prefix rdma/ --quiet"
"${cli[@]}" bench --keys "$gets" --ops "$gets" --distribution uniform --verify --value-size 256 --prefix rdma/ --quiet |
	sed 's/^/  /' || fail "" "bench failed"
cnames=(sent_pkts rcvd_pkts rdma_sends rdma_recvs)
declare -A before after reads
for d in "${devs[@]:0:4}"; do
	for c in "${cnames[@]}"; do before[$d.$c]=$(hw "$d" "$c"); done
done
req_before=$(requests) || fail "" "status (before) failed"
others_before=$(others) || fail "" "status (before) failed"
tg=$SECONDS
for ((k = 0; k < gets; k++)); do
	# Count bytes with wc: bench's values are binary (they encode key and
	# version), and a shell variable would drop their NUL bytes.
	n=$("${cli[@]}" get "rdma/$k" | wc -c) || fail "" "get rdma/$k failed"
	[[ $n -eq 256 ]] || fail "" "get rdma/$k: $n bytes, want 256"
done
tg=$((SECONDS - tg))
for d in "${devs[@]:0:4}"; do
	for c in "${cnames[@]}"; do after[$d.$c]=$(hw "$d" "$c"); done
done
req_after=$(requests) || fail "" "status (after) failed"
others_after=$(others) || fail "" "status (after) failed"
echo "  $gets gets, each its own rkv-client process, in ${tg}s; every value checked (256 bytes)"
echo
echo "  rxe hw_counters (port 1), growth during the GET-only phase:"
printf '    %-6s %-6s %10s %10s %11s %11s\n' NODE DEVICE sent_pkts rcvd_pkts rdma_sends rdma_recvs
bad=0
for i in 0 1 2 3; do
	d=${devs[$i]} name=client
	[[ $i -lt 3 ]] && name=${nodes[$i]}
	declare -A dl=()
	for c in "${cnames[@]}"; do dl[$c]=$((after[$d.$c] - before[$d.$c])); done
	printf '    %-6s %-6s %10s %10s %11s %11s\n' "$name" "$d" "+${dl[sent_pkts]}" "+${dl[rcvd_pkts]}" "+${dl[rdma_sends]}" "+${dl[rdma_recvs]}"
	if [[ $i -lt 3 ]]; then
		if ((dl[sent_pkts] == 0 || dl[rcvd_pkts] == 0)); then
			echo "    !! no RoCE packets on $name's device $d" >&2
			bad=1
		fi
		if ((dl[rdma_recvs] != 0)); then
			echo "    !! $name's device $d received $((dl[rdma_recvs])) two-sided SENDs" >&2
			bad=1
		fi
		srv_pkts=$((${srv_pkts:-0} + dl[sent_pkts]))
		reads[$name]=${dl[rcvd_pkts]}
	else
		((dl[rcvd_pkts] > 0)) || {
			echo "    !! the client's device received nothing" >&2
			bad=1
		}
	fi
done
echo "  (hw_counters count RoCE packets only: gossip and the control TCP traffic are not in them.)"
echo "  The servers' devices sent $srv_pkts packets (RDMA READ responses; a 256-byte value and the"
echo "  1 KiB index neighborhood fit one 1024-byte MTU each) for as many READ requests received;"
echo "  rdma_recvs, two-sided SENDs received, stayed 0."
echo
echo "  handled control requests (rkv-client status, REQUESTS), before -> after:"
while read -r n b; do
	a=$(awk -v n="$n" '$1 == n {print $2}' <<<"$req_after")
	ob=$(awk -v n="$n" '$1 == n {print $2}' <<<"$others_before")
	oa=$(awk -v n="$n" '$1 == n {print $2}' <<<"$others_after")
	printf '    %-6s %6d -> %6d  (+%d; other than Hello, GetMap, Stats and lease renewals: +%d; %d READ requests = 2 per get: index + record)\n' \
		"$n" "$b" "$a" $((a - b)) $((oa - ob)) "${reads[$n]:-0}"
	if ((oa != ob)); then
		echo "    !! $n handled $((oa - ob)) requests besides connection setup, map fetches and status: GETs reached server handlers" >&2
		bad=1
	fi
done <<<"$req_before"
echo "  Each get process only sets up: a Hello and a map fetch (GetMap) at one server, a Hello at its"
echo "  key's server if that is another, then RDMA_READs; a GET served by a handler would show above."
[[ $bad -eq 0 ]] || fail "" "the GET-only phase does not look like one-sided RDMA (see above)"
echo "  => GETs were served by RDMA_READ from server memory, not by server handlers."

say "stopping the cluster (SIGTERM)"
for i in 1 2 3; do kill -TERM "${pids[$i]}"; done
rc=0
for i in 1 2 3; do
	name=${nodes[$i - 1]}
	deadline=$((SECONDS + 30))
	while alive "$i" && ((SECONDS < deadline)); do sleep 0.2; done
	if alive "$i"; then
		echo "$name still running 30s after SIGTERM: killing it" >&2
		kill -KILL "${pids[$i]}" 2>/dev/null || true
		tail -n 10 "$state/$name.log" >&2
		rc=1
	fi
	st=0
	wait "${pids[$i]}" || st=$?
	if [[ $st -ne 0 ]]; then
		echo "$name exited with status $st" >&2
		tail -n 10 "$state/$name.log" >&2
		rc=1
	else
		echo "  $name stopped cleanly (exit 0)"
	fi
	pids[i]=
done
[[ $rc -eq 0 ]] || fail "" "not every node stopped cleanly"
printf '\ndemo-rxe guest part OK in %ds\n' $((SECONDS - t0))
