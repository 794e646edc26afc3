#!/usr/bin/env bash
# selftest.sh - prove the rxe VM harness end to end (needs prepare.sh first;
# run.sh runs it on its own if the cache is empty).
#
#   1. exit codes propagate (run.sh -- false -> 1, sh -c 'exit 7' -> 7)
#   2. --rxe 1: rxe0 PORT_ACTIVE; ibv_rc_pingpong and ib_read_lat loopback
#      on rxe0 (rxe0 talking to itself over its own address)
#   3. --rxe 2: rxe0 and rxe1 PORT_ACTIVE; ibv_rc_pingpong, ib_read_lat,
#      ib_write_lat and rdma_cm (rping) from rxe0 to rxe1; both devices'
#      hw_counters show the packets crossed
#   4. --rxe 4: ib_write_lat across the bridge between all four devices
#   5. if `go` is on PATH: a Go binary built on the host into /tmp runs in
#      the VM and sees the RKV_RXE_* environment
#
# Prints the latency numbers; exits non-zero on any failure.
# Usage: bash deploy/rxevm/selftest.sh [--quick]   (--quick: only 3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUNSH=$HERE/run.sh
QUICK=0
case ${1:-} in
'') ;;
--quick) QUICK=1 ;;
-h | --help)
	awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
	exit 0
	;;
*) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

say() { printf '\n=== selftest: %s\n' "$*"; }
fail() { printf 'selftest: FAIL: %s\n' "$*" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rkv-selftest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"

# ------------------------------------------------ the script run in the VM
# Runs as root in the guest; $1 is the scenario (one or two).
cat >"$WORK/in-vm.sh" <<'EOF'
#!/bin/bash
set -uo pipefail
scenario=$1
GIDX=${RKV_RXE_GID_INDEX:?}
IFS=, read -r -a DEVS <<<"${RKV_RXE_DEVICES:?}"
IFS=, read -r -a ADDRS <<<"${RKV_RXE_ADDRS:?}"
errors=0
bad() { echo "FAIL: $*"; errors=$((errors + 1)); }
ok() { echo "ok: $*"; }
T=60 # seconds per tool; a hang must not eat the VM timeout

counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }
wait_listen() { # port
	local i
	for ((i = 0; i < 100; i++)); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.1
	done
	return 1
}
# server_client NAME PORT "server cmd" "client cmd": run a perftest-style pair
server_client() {
	local name=$1 port=$2 scmd=$3 ccmd=$4 spid src=0 crc=0
	timeout "$T" $scmd >"/tmp/$name.server" 2>&1 &
	spid=$!
	wait_listen "$port" || { bad "$name: server did not listen"; cat "/tmp/$name.server"; kill $spid 2>/dev/null; return 1; }
	timeout "$T" $ccmd >"/tmp/$name.client" 2>&1 || crc=$?
	wait $spid || src=$?
	if [ $crc != 0 ] || [ $src != 0 ]; then
		bad "$name: client status $crc, server status $src"
		sed 's/^/  client| /' "/tmp/$name.client"
		sed 's/^/  server| /' "/tmp/$name.server"
		return 1
	fi
	return 0
}
# perftest prints one result row after the header with "t_typical"
lat_row() { awk '/t_typical/ { getline; print; exit }' "$1"; }
report_lat() { # name file
	local row
	row=$(lat_row "$2")
	[ -n "$row" ] || { bad "$1: no result row"; cat "$2"; return; }
	# bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
	set -- "$1" $row
	printf 'LAT %-28s bytes=%s iters=%s min=%sus typical=%sus avg=%sus p99=%sus\n' \
		"$1" "$2" "$3" "$4" "$6" "$7" "${9:-?}"
	case $6 in *inf* | *nan*) echo "note: perftest could not time this run (its cycle clock under TCG); the hw_counters check below still applies" ;; esac
}

echo "devices: ${RKV_RXE_DEVICES} netdevs: ${RKV_RXE_NETDEVS} addrs: ${RKV_RXE_ADDRS} gid index: $GIDX"
[ "$(ulimit -l)" = unlimited ] && ok "RLIMIT_MEMLOCK unlimited" || bad "RLIMIT_MEMLOCK is $(ulimit -l)"
for d in "${DEVS[@]}"; do
	if ibv_devinfo -d "$d" | grep -q 'state:.*PORT_ACTIVE'; then
		ok "$d PORT_ACTIVE ($(ibv_devinfo -d "$d" | awk '/active_mtu/ { print "active_mtu " $2 }'))"
	else
		bad "$d not PORT_ACTIVE"; ibv_devinfo -d "$d"
	fi
	t=$(cat "/sys/class/infiniband/$d/ports/1/gid_attrs/types/$GIDX")
	[ "$t" = "RoCE v2" ] && ok "$d GID $GIDX is RoCE v2: $(cat "/sys/class/infiniband/$d/ports/1/gids/$GIDX")" ||
		bad "$d GID $GIDX type is '$t'"
done

declare -A s0 r0
snap() { for d in "${DEVS[@]}"; do s0[$d]=$(counter "$d" sent_pkts); r0[$d]=$(counter "$d" rcvd_pkts); done; }
check_counters() { # label min-packets dev...
	local label=$1 min=$2 d s r
	shift 2
	for d in "$@"; do
		s=$(($(counter "$d" sent_pkts) - s0[$d]))
		r=$(($(counter "$d" rcvd_pkts) - r0[$d]))
		if [ "$s" -ge "$min" ] && [ "$r" -ge "$min" ]; then
			ok "$label: $d hw_counters sent_pkts +$s rcvd_pkts +$r"
		else
			bad "$label: $d hw_counters sent_pkts +$s rcvd_pkts +$r (want >= $min each)"
		fi
	done
}

case $scenario in
one)
	d=${DEVS[0]} a=${ADDRS[0]}
	snap
	if server_client pingpong 18600 "ibv_rc_pingpong -d $d -g $GIDX -n 200 -p 18600" \
		"ibv_rc_pingpong -d $d -g $GIDX -n 200 -p 18600 $a"; then
		ok "ibv_rc_pingpong loopback on $d: $(grep -h 'usec/iter' /tmp/pingpong.client)"
	fi
	check_counters "pingpong loopback" 200 "$d"
	snap
	if server_client read_lat 18601 "ib_read_lat -d $d -x $GIDX -n 500 -F -p 18601" \
		"ib_read_lat -d $d -x $GIDX -n 500 -F -p 18601 $a"; then
		report_lat "ib_read_lat $d loopback" /tmp/read_lat.client
	fi
	check_counters "ib_read_lat loopback" 500 "$d"
	;;
two)
	c=${DEVS[0]} s=${DEVS[1]} sa=${ADDRS[1]} ca=${ADDRS[0]}
	snap
	if server_client pingpong 18600 "ibv_rc_pingpong -d $s -g $GIDX -n 200 -p 18600" \
		"ibv_rc_pingpong -d $c -g $GIDX -n 200 -p 18600 $sa"; then
		ok "ibv_rc_pingpong $c -> $s: $(grep -h 'usec/iter' /tmp/pingpong.client)"
	fi
	check_counters "pingpong $c->$s" 200 "$c" "$s"
	snap
	if server_client read_lat 18601 "ib_read_lat -d $s -x $GIDX -n 1000 -F -p 18601" \
		"ib_read_lat -d $c -x $GIDX -n 1000 -F -p 18601 $sa"; then
		report_lat "ib_read_lat $c->$s" /tmp/read_lat.client
	fi
	check_counters "ib_read_lat $c->$s" 1000 "$c" "$s"
	snap
	if server_client write_lat 18602 "ib_write_lat -d $s -x $GIDX -n 1000 -F -p 18602" \
		"ib_write_lat -d $c -x $GIDX -n 1000 -F -p 18602 $sa"; then
		report_lat "ib_write_lat $c->$s" /tmp/write_lat.client
	fi
	check_counters "ib_write_lat $c->$s" 1000 "$c" "$s"
	snap
	if server_client read_bw 18603 "ib_read_bw -d $s -x $GIDX -n 200 -s 65536 -F -p 18603" \
		"ib_read_bw -d $c -x $GIDX -n 200 -s 65536 -F -p 18603 $sa"; then
		echo "BW  ib_read_bw $c->$s 64KiB: $(awk '/BW average/ { getline; print $4 " MB/s"; exit }' /tmp/read_bw.client)"
	fi
	check_counters "ib_read_bw $c->$s" 200 "$c" "$s"
	# rdma_cm: bind the client to rxe0's address (-I), or the CM picks rxe1
	# for both ends.  rping listens on no TCP port: give the server a second,
	# and retry the client (a REJECT means the listener was not there yet).
	snap
	timeout "$T" rping -s -a "$sa" -C 20 -S 1024 >/tmp/rping.server 2>&1 &
	spid=$!
	sleep 1
	crc=1
	for try in 1 2 3; do
		if timeout "$T" rping -c -a "$sa" -I "$ca" -C 20 -S 1024 >/tmp/rping.client 2>&1; then
			crc=0
			break
		fi
		echo "note: rping client attempt $try failed: $(tr '\n' ' ' </tmp/rping.client)"
		sleep 1
	done
	src=0
	[ $crc = 0 ] && { wait $spid || src=$?; }
	if [ $crc = 0 ] && [ $src = 0 ]; then
		ok "rdma_cm rping $ca -> $sa (20 pings)"
	else
		kill $spid 2>/dev/null
		bad "rdma_cm rping $ca -> $sa"; cat /tmp/rping.client /tmp/rping.server
	fi
	check_counters "rping $c->$s" 20 "$c" "$s"
	rdma statistic show
	;;
four)
	# Four devices on one bridge: every device is client once and server
	# once, across the bridge (exercises ARP on a shared L2 segment).
	snap
	port=18610
	for pair in 0:3 1:2 2:0 3:1; do
		c=${DEVS[${pair%:*}]} s=${DEVS[${pair#*:}]} sa=${ADDRS[${pair#*:}]}
		if server_client "write_lat_$c$s" $port "ib_write_lat -d $s -x $GIDX -n 200 -F -p $port" \
			"ib_write_lat -d $c -x $GIDX -n 200 -F -p $port $sa"; then
			report_lat "ib_write_lat $c->$s" "/tmp/write_lat_$c$s.client"
		fi
		port=$((port + 1))
	done
	check_counters "4 devices, ring of ib_write_lat" 400 "${DEVS[@]}"
	;;
*) bad "unknown scenario $scenario" ;;
esac
[ $errors = 0 ] && echo "IN-VM RESULT: PASS" || echo "IN-VM RESULT: FAIL ($errors)"
exit $((errors > 0))
EOF
chmod 755 "$WORK/in-vm.sh"

t0=$SECONDS
# ------------------------------------------------------------- exit codes
if [ $QUICK = 0 ]; then
	say "exit codes propagate"
	rc=0
	bash "$RUNSH" -- false </dev/null || rc=$?
	[ $rc = 1 ] || fail "run.sh -- false exited $rc, want 1"
	rc=0
	bash "$RUNSH" -- sh -c 'echo to-stdout; echo to-stderr >&2; exit 7' </dev/null \
		>"$WORK/out" 2>"$WORK/err" || rc=$?
	[ $rc = 7 ] || fail "run.sh -- sh -c 'exit 7' exited $rc, want 7"
	grep -qx to-stdout "$WORK/out" || fail "stdout not carried: $(cat "$WORK/out")"
	grep -qx to-stderr "$WORK/err" || fail "stderr not carried: $(cat "$WORK/err")"
	echo "ok: false -> 1, exit 7 -> 7, stdout and stderr carried separately"
fi

# ------------------------------------------------------------- one device
if [ $QUICK = 0 ]; then
	say "--rxe 1: rxe0 loopback"
	bash "$RUNSH" --rxe 1 --timeout 600 -- "$WORK/in-vm.sh" one </dev/null | tee "$WORK/one.log" ||
		fail "scenario one failed"
fi

# ------------------------------------------------------------ two devices
say "--rxe 2: rxe0 <-> rxe1 over a veth pair"
bash "$RUNSH" --rxe 2 --timeout 600 -- "$WORK/in-vm.sh" two </dev/null | tee "$WORK/two.log" ||
	fail "scenario two failed"

# ----------------------------------------------------------- four devices
if [ $QUICK = 0 ]; then
	say "--rxe 4: four devices on a bridge"
	bash "$RUNSH" --rxe 4 --timeout 600 -- "$WORK/in-vm.sh" four </dev/null | tee "$WORK/four.log" ||
		fail "scenario four failed"
fi

# ------------------------------------------------------------ Go binary
if [ $QUICK = 0 ] && command -v go >/dev/null; then
	say "a Go binary built on the host runs in the VM"
	mkdir -p "$WORK/gohello"
	cat >"$WORK/gohello/main.go" <<'EOF'
package main

import (
	"fmt"
	"os"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Printf("hello from Go in the VM: cwd=%s devices=%s gid=%s\n",
		wd, os.Getenv("RKV_RXE_DEVICES"), os.Getenv("RKV_RXE_GID_INDEX"))
	os.Exit(5)
}
EOF
	printf 'module example.com/hello\n\ngo 1.20\n' >"$WORK/gohello/go.mod"
	(cd "$WORK/gohello" && CGO_ENABLED=0 GOFLAGS='' go build -o hello .) ||
		fail "go build failed"
	rc=0
	out=$(cd "$WORK/gohello" && bash "$RUNSH" --rxe 2 -- ./hello </dev/null) || rc=$?
	echo "$out"
	[ $rc = 5 ] || fail "Go binary exited $rc, want 5"
	[ "$out" = "hello from Go in the VM: cwd=$WORK/gohello devices=rxe0,rxe1 gid=1" ] ||
		fail "unexpected Go output"
	echo "ok: Go binary ran at its host path with the caller's cwd, exit 5 propagated"
fi

say "summary ($((SECONDS - t0)) s)"
cat "$WORK"/*.log 2>/dev/null | grep -E '^(LAT|BW) ' || true
echo "selftest: PASS"
