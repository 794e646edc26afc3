#!/usr/bin/env bash
# The rkv demo: a 3-server cluster on this machine (soft RDMA provider, 127.0.0.1
# only) and a scripted rkv-client session against it.
#
#   deploy/demo/demo.sh        start, run the session and a short bench, stop (make demo)
#   deploy/demo/demo.sh up     start and leave the cluster running    (make demo-up)
#   deploy/demo/demo.sh down   stop the cluster left by "up"           (make demo-down)
#
# It builds nothing: run "make build" first (the make targets do). State lives
# in .demo/ at the repository root (gitignored): one data dir and log per node,
# and the pids. Ports: gossip BASE+1..3, control BASE+11..13, data BASE+21..23
# (the run's fourth server, which joins and is forgotten again: BASE+4, 14, 24),
# BASE=${RKV_DEMO_BASE_PORT:-7400}.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=$root/bin
state=$root/.demo
base=${RKV_DEMO_BASE_PORT:-7400}
# rkv-client reads RKV_* as its flags: it would warn about this one.
unset RKV_DEMO_BASE_PORT
nodes=(node1 node2 node3)
mode=${1:-run}

say() { printf '\n== %s\n' "$*"; }

gossip_port() { echo $((base + $1)); }
metrics_port() { echo $((base + 30 + $1)); }

# http_ok PORT PATH: whether GET PATH on 127.0.0.1:PORT answers 200 (bash's
# /dev/tcp: no curl needed).
http_ok() {
	local status
	# The braces keep 2>/dev/null to the connect: on exec itself it would
	# silence the script's stderr from then on (rkv-client's messages too).
	{ exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
	read -r _ status _ <&3 || status=
	exec 3<&- 3>&-
	[[ $status == 200 ]]
}

# fail NODE-INDEX|"" MESSAGE: report, show the node's log tail, exit 1.
fail() {
	local i=$1
	shift
	echo "demo FAILED: $* (server logs in $state/)" >&2
	if [[ -n $i ]]; then
		local log=$state/${nodes[$i - 1]}.log
		echo "-- last lines of ${nodes[$i - 1]}'s log ($log):" >&2
		tail -n 15 "$log" >&2 || true
	fi
	exit 1
}

pid_of() { cat "$state/${nodes[$1 - 1]}.pid" 2>/dev/null || true; }

alive() {
	local pid
	pid=$(pid_of "$1")
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# stop_all: SIGTERM every node, wait for each (10 s), check its exit status.
stop_all() {
	local rc=0
	for i in 1 2 3; do
		alive "$i" && kill -TERM "$(pid_of "$i")"
	done
	for i in 1 2 3; do
		local pid name=${nodes[$i - 1]}
		pid=$(pid_of "$i")
		[[ -n $pid ]] || continue
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "$name (pid $pid) still running 10s after SIGTERM: killing it; log: $state/$name.log" >&2
			kill -KILL "$pid" 2>/dev/null || true
			rc=1
		fi
		# Our own children report their status through wait; nodes started by
		# an earlier "up" are not our children: their log says how they ended.
		local status=0
		if wait "$pid" 2>/dev/null; then status=0; else status=$?; fi
		if [[ $status -eq 127 ]]; then # not our child
			grep -q 'msg=stopped' "$state/$name.log" && status=0 || status=1
		fi
		if [[ $status -ne 0 ]]; then
			echo "$name exited with status $status; log: $state/$name.log" >&2
			rc=1
		else
			echo "$name stopped cleanly (exit 0)"
		fi
		rm -f "$state/$name.pid"
	done
	return $rc
}

start_all() {
	for b in rkv-server rkv-client; do
		[[ -x $bin/$b ]] || fail "" "$bin/$b is missing: run make build (make demo does)"
	done
	for i in 1 2 3; do
		if alive "$i"; then
			fail "" "a demo cluster is already running (pids in $state): run make demo-down first"
		fi
	done
	rm -rf "$state"
	mkdir -p "$state"
	for i in 1 2 3; do
		start_node "$i"
		# The next node joins through node1: wait for node1 to serve first.
		if [[ $i -eq 1 ]]; then wait_ready 1; fi
	done
	for i in 2 3; do wait_ready "$i"; done
	printf 'waiting for all arenas to register and the view to converge...'
	# members --expect-arenas waits until every server advertises its 4
	# arenas, which it does as each registers.
	if ! out=$("$bin/rkv-client" --endpoints "127.0.0.1:$((base + 11))" --timeout 90s members --expect-servers 3 --expect-arenas 4 2>&1); then
		echo
		echo "$out" >&2
		fail 1 "the view did not converge to 3 servers with 4 arenas each"
	fi
	echo " done"
	for i in 1 2 3; do
		echo "  $(grep -o 'msg=ready.*' "$state/${nodes[$i - 1]}.log" | head -1 | sed 's/msg=ready //; s/ provider=.*//')  log: .demo/${nodes[$i - 1]}.log"
	done
}

# start_node I: start node I in the background on its data directory and
# ports: node1 bootstraps a cluster keeping 3 copies of every shard (on its
# first start), the others join through it.
start_node() {
	local i=$1 name=${nodes[$1 - 1]} join=(--bootstrap --replicas 3)
	[[ $i -gt 1 ]] && join=(--join "127.0.0.1:$(gossip_port 1)")
	"$bin/rkv-server" --name "$name" --data-dir "$state/$name" --provider soft \
		--gossip-addr "127.0.0.1:$(gossip_port "$i")" --control-addr "127.0.0.1:$((base + 10 + i))" \
		--data-addr "127.0.0.1:$((base + 20 + i))" --metrics-addr "127.0.0.1:$(metrics_port "$i")" "${join[@]}" \
		--arena-size 16MiB --arena-count 4 --index-slots 65536 --lease-size 1MiB \
		>>"$state/$name.log" 2>&1 &
	echo $! >"$state/$name.pid"
}

# lose_a_node: node2 is killed with SIGKILL; its shards fail over to their
# backups and it is dropped as a backup of the others, so every key stays
# readable and writable; back on its data directory, it gets replicas again.
lose_a_node() {
	say "losing a node: node2 is killed with SIGKILL; every shard has 3 copies"
	echo "\$ kill -9 $(pid_of 2)   # node2"
	kill -KILL "$(pid_of 2)"
	wait "$(pid_of 2)" 2>/dev/null || true
	local t0
	t0=$(date +%s%N)
	run_cli 0 put user:1 alice-again
	echo "(that put waited $((($(date +%s%N) - t0) / 1000000)) ms: for the map's leader to see node2's process gone, its session to it ended, then for the failover)"
	local k
	for k in user:1 city:paris; do
		echo "\$ rkv-client get $k"
		"${cli[@]}" get "$k" || fail "" "get $k after node2's loss failed"
		echo
	done
	run_cli 0 bench --workload c --keys 1000 --ops 2000 --value-size 128 --concurrency 4 --verify --load=false --quiet
	say "node2 restarts on its data directory: it is given replicas again"
	echo "\$ rkv-server --name node2 ... &"
	start_node 2
	wait_ready 2
	run_cli 0 --timeout 60s members --expect-servers 3 --expect-arenas 4 >/dev/null
	run_cli 0 bench --workload c --keys 1000 --ops 2000 --value-size 128 --concurrency 4 --verify --load=false --quiet
}

# wait_ready I: wait (10 s) for node I's /readyz to answer 200 (it serves:
# an arena registered, and the cluster map holds it).
wait_ready() {
	local i=$1 name=${nodes[$1 - 1]}
	printf 'starting %s...' "$name"
	for _ in $(seq 200); do
		if http_ok "$(metrics_port "$i")" /readyz; then
			echo " ready"
			return
		fi
		alive "$i" || { echo; fail "$i" "$name exited during start"; }
		sleep 0.05
	done
	echo
	fail "$i" "$name not ready after 10s"
}

# grow_and_shrink: a fourth server joins, takes its share of the shards (the
# keys move to it while they are read), is forgotten (its shards move back)
# and stopped; every value is checked after each step.
grow_and_shrink() {
	local name=node4 log=$state/node4.log
	say "growing the cluster: $name joins and takes its share of the shards"
	local seed=127.0.0.1:$(gossip_port 1)
	echo "\$ rkv-server --name $name --join $seed ... &"
	: >"$log"
	"$bin/rkv-server" --name "$name" --data-dir "$state/$name" --provider soft \
		--gossip-addr "127.0.0.1:$((base + 4))" --control-addr "127.0.0.1:$((base + 14))" \
		--data-addr "127.0.0.1:$((base + 24))" --join "$seed" \
		--arena-size 16MiB --arena-count 4 --index-slots 65536 --lease-size 1MiB >"$log" 2>&1 &
	local pid=$!
	echo "$pid" >"$state/$name.pid"
	run_cli 0 --timeout 60s members --expect-servers 4 --expect-arenas 4 >/dev/null
	run_cli 0 map
	run_cli 0 status
	run_cli 0 bench --workload c --keys 1000 --ops 2000 --value-size 128 --concurrency 4 --verify --load=false --quiet
	say "shrinking it again: $name is forgotten (drained: its shards move back), and stops by itself"
	run_cli 0 --timeout 60s forget "$name"
	wait "$pid" || fail "" "$name exited with status $? once removed; log: $log"
	rm -f "$state/$name.pid"
	echo "$name stopped cleanly (exit 0): \"$(grep -o 'msg="removed from the cluster map: stopping"' "$log" | head -1)\""
	run_cli 0 map
	run_cli 0 bench --workload c --keys 1000 --ops 2000 --value-size 128 --concurrency 4 --verify --load=false --quiet
}

cli=("$bin/rkv-client")
# shellcheck source=deploy/demo/session.sh
source "$root/deploy/demo/session.sh"

case $mode in
up)
	say "starting 3 rkv-server processes (soft provider, 127.0.0.1)"
	start_all
	cat <<EOF

The cluster is running. Try:
  export RKV_ENDPOINTS=127.0.0.1:$((base + 11))   # a server's control address (or RKV_JOIN=127.0.0.1:$(gossip_port 1): gossip)
  bin/rkv-client put hello world
  bin/rkv-client get hello
  bin/rkv-client members
  bin/rkv-client status
Logs and data: .demo/   Stop it with: make demo-down
EOF
	;;
down)
	found=0
	for i in 1 2 3; do [[ -n $(pid_of "$i") ]] && found=1; done
	if [[ $found -eq 0 ]]; then
		echo "no demo cluster running (no pids in $state)"
		exit 0
	fi
	stop_all
	;;
run)
	t0=$(date +%s%N)
	trap 'for i in 1 2 3; do alive $i && kill -KILL "$(pid_of $i)" 2>/dev/null; done; [[ -f $state/node4.pid ]] && kill -KILL "$(cat "$state/node4.pid")" 2>/dev/null; true' EXIT
	say "starting 3 rkv-server processes (soft provider, 127.0.0.1)"
	start_all
	# The session asks node1's control port for the view: no gossip join,
	# a few ms per command (RKV_JOIN, a gossip address, works too, ~250 ms).
	RKV_ENDPOINTS=127.0.0.1:$((base + 11))
	export RKV_ENDPOINTS
	say "a session (RKV_ENDPOINTS=$RKV_ENDPOINTS)"
	demo_session
	say "a short bench: load 1000 keys of 128 bytes, then 5000 zipfian gets, every value checked, 4 goroutines"
	run_cli 0 bench --workload c --keys 1000 --ops 5000 --value-size 128 --concurrency 4 --verify
	lose_a_node
	grow_and_shrink
	say "stopping the cluster (SIGTERM: leases end, commits finish, memory is deregistered, nodes leave)"
	stop_all || fail "" "not every node stopped cleanly"
	trap - EXIT
	ms=$((($(date +%s%N) - t0) / 1000000))
	printf '\ndemo OK in %d.%ds\n' $((ms / 1000)) $((ms % 1000 / 100))
	;;
*)
	echo "usage: $0 [run|up|down]" >&2
	exit 2
	;;
esac
