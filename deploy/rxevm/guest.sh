#!/bin/bash
# guest.sh - stage 2 of the rkv rxe VM, run by the initramfs init (stage 1)
# inside the chroot that shows the host's files at their own paths.
# run.sh copies it into the per-run folder; it is not meant to be run by hand.
#
# $1 is the per-run folder (shared read-write with the host).  It reads
# config (KVER, MODDIR, NRXE, NET_MTU, CWD), env (exports) and cmd (CMD=(...)),
# sets up rdma_rxe on veth pairs, runs the command and writes its exit code
# to rc, or a reason to setup-failed.
set -uo pipefail

RUN=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset rkvrun TERM # inherited from the kernel command line / stage 1

say() {
	local up
	read -r up _ </proc/uptime
	printf 'rkv-vm: [%s] %s\n' "$up" "$*"
}
fail() {
	say "setup failed: $*"
	printf '%s\n' "$*" >"$RUN/setup-failed"
	dmesg >"$RUN/dmesg" 2>/dev/null
	exit 1
}

# shellcheck source=/dev/null
. "$RUN/config" || fail "cannot read $RUN/config"

# -------------------------------------------------------------- modules
say "stage 2 started"
mkdir -p "/lib/modules/$KVER" || fail "cannot create /lib/modules/$KVER"
mount --bind "$MODDIR" "/lib/modules/$KVER" || fail "cannot bind-mount the module tree"
# rdma_rxe asks the crypto API for crc32 on demand; preload it.
modprobe -q -a crc32_generic crc32_pclmul virtio_rng 2>/dev/null
mods=(veth rdma_rxe ib_uverbs rdma_ucm)
[ "$NRXE" -gt 2 ] && mods+=(bridge)
modprobe -a "${mods[@]}" || fail "modprobe ${mods[*]} failed"
say "modules loaded"

# -------------------------------------------------------------- network
# All addresses are in 198.18.0.0/24 (RFC 2544 benchmarking range) and all
# traffic stays inside the guest: the VM has no NIC at all.
#   1 device:  rxe0 on veth0 (198.18.0.1); the peer veth0p is there for carrier
#   2 devices: rxe0 and rxe1 on the two ends of one veth pair (.1, .2)
#   3-4:       one veth pair per device, far ends (vethNb) on bridge rkvbr0
# accept_local=1: the devices send to addresses that are local to this
# kernel; without it the packets are dropped as martians.
# rxe sends through the IP stack, which ARPs for the peer on the outgoing
# veth: arp_ignore=1/arp_announce=2 make only the interface that owns an
# address answer for it (else, on the bridge, every veth answers for every
# local address and packets go to the wrong rxe device).
for k in all default; do
	echo 1 >"/proc/sys/net/ipv4/conf/$k/accept_local"
	echo 1 >"/proc/sys/net/ipv4/conf/$k/arp_ignore"
	echo 2 >"/proc/sys/net/ipv4/conf/$k/arp_announce"
done
NETDEVS=()
ADDRS=()
IPCMDS=("link set lo up")
case $NRXE in
1)
	IPCMDS+=("link add veth0 type veth peer name veth0p")
	NETDEVS=(veth0)
	PEERS=(veth0p)
	;;
2)
	IPCMDS+=("link add veth0 type veth peer name veth1")
	NETDEVS=(veth0 veth1)
	PEERS=()
	;;
3 | 4)
	IPCMDS+=("link add rkvbr0 mtu $NET_MTU type bridge forward_delay 0")
	NETDEVS=()
	PEERS=()
	for ((i = 0; i < NRXE; i++)); do
		IPCMDS+=("link add veth$i type veth peer name veth${i}b")
		IPCMDS+=("link set veth${i}b master rkvbr0")
		NETDEVS+=("veth$i")
		PEERS+=("veth${i}b")
	done
	IPCMDS+=("link set rkvbr0 up")
	;;
*) fail "unsupported rxe device count: $NRXE" ;;
esac
for ((i = 0; i < NRXE; i++)); do
	ADDRS+=("198.18.0.$((i + 1))")
	IPCMDS+=("addr add ${ADDRS[$i]}/24 dev ${NETDEVS[$i]}")
done
for d in "${PEERS[@]}" "${NETDEVS[@]}"; do
	IPCMDS+=("link set $d mtu $NET_MTU up")
done
printf '%s\n' "${IPCMDS[@]}" | ip -batch - || fail "network setup failed"
for d in "${PEERS[@]}" "${NETDEVS[@]}"; do
	echo 1 >"/proc/sys/net/ipv4/conf/$d/accept_local"
done
say "network up"

# ------------------------------------------------------------ rxe devices
DEVS=()
for ((i = 0; i < NRXE; i++)); do
	rdma link add "rxe$i" type rxe netdev "${NETDEVS[$i]}" || fail "rdma link add rxe$i failed"
	DEVS+=("rxe$i")
done

# Wait for each port to be ACTIVE and its IPv4-mapped RoCEv2 GID to appear.
gid_of() { # a.b.c.d -> the IPv4-mapped GID as sysfs prints it
	local IFS=.
	# shellcheck disable=SC2086
	set -- $1
	printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4"
}
readf() { # file -> first line, or empty (no fork)
	local l=
	{ read -r l <"$1"; } 2>/dev/null
	printf '%s' "$l"
}
GID_INDEX=
for ((i = 0; i < NRXE; i++)); do
	port=/sys/class/infiniband/rxe$i/ports/1
	want=$(gid_of "${ADDRS[$i]}")
	idx=
	for ((t = 0; t < 200; t++)); do
		state=$(readf "$port/state")
		if [ "${state#*ACTIVE}" != "$state" ]; then
			# The IPv4 GID is normally at index 1 (0 is the IPv6 link-local).
			for ((n = 0; n < 16; n++)); do
				if [ "$(readf "$port/gids/$n")" = "$want" ] &&
					[ "$(readf "$port/gid_attrs/types/$n")" = "RoCE v2" ]; then
					idx=$n
					break
				fi
			done
			[ -n "$idx" ] && break
		fi
		sleep 0.05
	done
	[ -n "$idx" ] || fail "rxe$i: port not ACTIVE or no RoCEv2 GID for ${ADDRS[$i]}"
	if [ -z "$GID_INDEX" ]; then
		GID_INDEX=$idx
	elif [ "$GID_INDEX" != "$idx" ]; then
		fail "rxe devices disagree on the RoCEv2 GID index ($GID_INDEX vs $idx)"
	fi
done

join() { local IFS=,; printf '%s' "$*"; }

# ---------------------------------------------------------------- command
# shellcheck source=/dev/null
. "$RUN/env" || fail "cannot read $RUN/env"
export RKV_RXE_VM=1
RKV_RXE_DEVICES=$(join "${DEVS[@]}")
RKV_RXE_NETDEVS=$(join "${NETDEVS[@]}")
RKV_RXE_ADDRS=$(join "${ADDRS[@]}")
RKV_RXE_GID_INDEX=$GID_INDEX
export RKV_RXE_DEVICES RKV_RXE_NETDEVS RKV_RXE_ADDRS RKV_RXE_GID_INDEX
ulimit -l unlimited || fail "cannot raise RLIMIT_MEMLOCK"
ulimit -n 65536 2>/dev/null

CMD=()
# shellcheck source=/dev/null
. "$RUN/cmd" || fail "cannot read $RUN/cmd"
[ ${#CMD[@]} -gt 0 ] || fail "empty command"
cd "$CWD" || fail "cannot cd to $CWD in the guest"

say "rxe ready (${RKV_RXE_DEVICES} on ${RKV_RXE_NETDEVS}, GID index $GID_INDEX); running the command"
: >"$RUN/started"
"${CMD[@]}" >>"$RUN/stdout" 2>>"$RUN/stderr" </dev/null
rc=$?
printf '%s\n' "$rc" >"$RUN/rc.tmp" && mv "$RUN/rc.tmp" "$RUN/rc"
say "command exited with status $rc"
if [ "${KEEP_DMESG:-0}" = 1 ]; then
	dmesg >"$RUN/dmesg" 2>/dev/null
fi
exit 0
