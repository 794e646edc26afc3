#!/usr/bin/env bash
# run.sh - run one command as root inside a throwaway qemu VM (Debian's own
# kernel, TCG) that has N Soft-RoCE (rdma_rxe) devices, and exit with the
# command's exit code.  The guest sees the host's files read-only at the same
# paths (9p + tmpfs overlay), so binaries built on the host run as they are.
#
# Usage: bash deploy/rxevm/run.sh [options] -- cmd [args...]
#   --rxe N          number of rxe devices, 1..4 (default 1; $RKV_VM_RXE)
#   --mem SIZE       guest memory, qemu syntax (default 4G; $RKV_VM_MEM)
#   --smp N          vCPUs (default 2; $RKV_VM_SMP)
#   --timeout SECS   wall-clock limit for the whole VM (default 1200;
#                    $RKV_VM_TIMEOUT); on expiry qemu is killed, exit 124
#   --env NAME       pass the caller's $NAME into the command (repeatable);
#   --env NAME=VAL   or set NAME=VAL.  RKV_*, GO*, CGO_*, PATH, HOME, USER,
#                    LANG, LC_*, TZ, CI are always passed through.
#   --mtu BYTES      MTU of the veth netdevs (default 1500 -> rxe MTU 1024)
#   --verbose        show the guest console (kernel + harness) on stderr
#   --keep           keep the per-run folder (console log, dmesg) and say where
#
# In the command's environment: RKV_RXE_VM=1, RKV_RXE_DEVICES=rxe0,rxe1,
# RKV_RXE_NETDEVS=veth0,veth1, RKV_RXE_ADDRS=198.18.0.1,198.18.0.2,
# RKV_RXE_GID_INDEX=1 (the RoCEv2 IPv4-mapped GID), RLIMIT_MEMLOCK unlimited,
# cwd = the caller's cwd, stdin = /dev/null.  stdout/stderr stream live.
#
# Exit status: the command's; 124 on timeout; 125 if the VM or the harness
# failed (no boot, panic, rxe setup failure) - with a message on stderr.
#
# Also: RKV_VM_CACHE (cache dir of prepare.sh), RKV_VM_VERBOSE=1 (--verbose),
# RKV_VM_KEEP=1 (--keep), RKV_VM_ACCEL=kvm (only on hosts with a real KVM:
# -accel kvm -cpu host; the default is TCG).  See docs/RXE-VM.md.
# shellcheck disable=SC2054 # commas inside qemu arguments are intended
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RKV_VM_CACHE:-${HOME:-/root}/.cache/rkv/rxevm}
NRXE=${RKV_VM_RXE:-1}
MEM=${RKV_VM_MEM:-4G}
SMP=${RKV_VM_SMP:-2}
TIMEOUT=${RKV_VM_TIMEOUT:-1200}
NET_MTU=1500
VERBOSE=${RKV_VM_VERBOSE:-0}
KEEP=${RKV_VM_KEEP:-0}
ACCEL=${RKV_VM_ACCEL:-tcg}
ENV_NAMES=()
ENV_SETS=()

say() { printf 'rxevm: %s\n' "$*" >&2; }
die() { printf 'rxevm: error: %s\n' "$*" >&2; exit 125; }
usage() { awk 'NR == 1 || /^# shellcheck/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

while [ $# -gt 0 ]; do
	case $1 in
	--rxe) NRXE=${2:?--rxe needs a value}; shift ;;
	--rxe=*) NRXE=${1#*=} ;;
	--mem) MEM=${2:?--mem needs a value}; shift ;;
	--mem=*) MEM=${1#*=} ;;
	--smp) SMP=${2:?--smp needs a value}; shift ;;
	--smp=*) SMP=${1#*=} ;;
	--timeout) TIMEOUT=${2:?--timeout needs a value}; shift ;;
	--timeout=*) TIMEOUT=${1#*=} ;;
	--mtu) NET_MTU=${2:?--mtu needs a value}; shift ;;
	--mtu=*) NET_MTU=${1#*=} ;;
	--env)
		case ${2:?--env needs a value} in
		*=*) ENV_SETS+=("$2") ;;
		*) ENV_NAMES+=("$2") ;;
		esac
		shift
		;;
	--verbose | -v) VERBOSE=1 ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	-*) usage >&2; die "unknown option: $1" ;;
	*) break ;;
	esac
	shift
done
[ $# -gt 0 ] || { usage >&2; die "no command given"; }
case $NRXE in 1 | 2 | 3 | 4) ;; *) die "--rxe must be 1..4" ;; esac
case $TIMEOUT in '' | *[!0-9]*) die "--timeout must be a number of seconds" ;; esac
case $SMP in '' | *[!0-9]*) die "--smp must be a number" ;; esac
case $NET_MTU in '' | *[!0-9]*) die "--mtu must be a number" ;; esac

[ "$(id -u)" = 0 ] || die "must run as root"
if [ ! -f "$CACHE/current.env" ]; then
	say "no prepared VM in $CACHE; running prepare.sh"
	bash "$HERE/prepare.sh" || die "prepare.sh failed"
fi
KVER='' KERNEL='' INITRD='' MODDIR=''
# shellcheck source=/dev/null
. "$CACHE/current.env"
for f in "$KERNEL" "$INITRD" "$MODDIR/modules.dep"; do
	[ -f "$f" ] || die "$f missing: run deploy/rxevm/prepare.sh"
done
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run deploy/rxevm/prepare.sh"

# ------------------------------------------------------- per-run folder
tmpbase=${TMPDIR:-/tmp}
case $tmpbase in *[!A-Za-z0-9/._-]*) tmpbase=/tmp ;; esac
RUN=$(mktemp -d "$tmpbase/rkv-vm.XXXXXX")
chmod 755 "$RUN"
QPID='' TAILS=()
# shellcheck disable=SC2317 # invoked by the traps
cleanup() {
	local p
	if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
		kill -TERM "$QPID" 2>/dev/null || true
		wait "$QPID" 2>/dev/null || true
	fi
	for p in "${TAILS[@]}"; do kill "$p" 2>/dev/null || true; done
	if [ "$KEEP" = 1 ]; then
		say "kept the run folder: $RUN"
	else
		rm -rf "$RUN"
	fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM HUP

cp "$HERE/guest.sh" "$RUN/guest.sh"
{
	printf 'KVER=%q\n' "$KVER"
	printf 'MODDIR=%q\n' "$MODDIR"
	printf 'NRXE=%q\n' "$NRXE"
	printf 'NET_MTU=%q\n' "$NET_MTU"
	printf 'CWD=%q\n' "$PWD"
	printf 'KEEP_DMESG=%q\n' "$KEEP"
} >"$RUN/config"
{
	printf 'CMD=('
	printf '%q ' "$@"
	printf ')\n'
} >"$RUN/cmd"
{
	while IFS= read -r name; do
		case $name in
		RKV_VM_* | RKV_RXE_*) ;; # the harness's own knobs / outputs
		RKV_* | GO* | CGO_* | PATH | HOME | USER | LOGNAME | LANG | LC_* | TZ | CI)
			printf 'export %s=%q\n' "$name" "${!name}" ;;
		esac
	done < <(compgen -e)
	for name in "${ENV_NAMES[@]}"; do
		case $name in *[!A-Za-z0-9_]* | [0-9]*) die "bad --env name: $name" ;; esac
		if [ -n "${!name+x}" ]; then
			printf 'export %s=%q\n' "$name" "${!name}"
		fi
	done
	for kv in "${ENV_SETS[@]}"; do
		name=${kv%%=*}
		case $name in '' | *[!A-Za-z0-9_]* | [0-9]*) die "bad --env name: $name" ;; esac
		printf 'export %s=%q\n' "$name" "${kv#*=}"
	done
} >"$RUN/env"
: >"$RUN/stdout"
: >"$RUN/stderr"
: >"$RUN/console.log"

# ---------------------------------------------------------------- qemu
case $ACCEL in
tcg) accel=(-accel tcg,thread=multi -cpu max) ;;
kvm) accel=(-accel kvm -cpu host) ;; # only for hosts with a real (vmx/svm) KVM
*) die "RKV_VM_ACCEL must be tcg or kvm" ;;
esac
append="console=ttyS0 panic=-1 rkvrun=$RUN mitigations=off cryptomgr.notests"
append+=" i8042.noaux i8042.nokbd i8042.nopnp 8250.nr_uarts=1 tsc=reliable no_timer_check"
if [ "$VERBOSE" = 1 ]; then append+=" loglevel=7"; else append+=" quiet"; fi

qemu=(
	qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
	"${accel[@]}" -smp "$SMP" -m "$MEM"
	-kernel "$KERNEL" -initrd "$INITRD" -append "$append"
	-fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
	-fsdev "local,id=rkvrun,path=$RUN,security_model=none,multidevs=remap"
	-device virtio-9p-pci,fsdev=rkvrun,mount_tag=rkvrun
	-device virtio-rng-pci
	-nic none -serial "file:$RUN/console.log" -monitor none
)

start=$(date +%s.%N)
# timeout(1) puts qemu in its own process group; the traps above end it.
timeout --kill-after=10 "$TIMEOUT" "${qemu[@]}" </dev/null >"$RUN/qemu.log" 2>&1 &
QPID=$!
tail -n +1 -s 0.2 --pid="$QPID" -f "$RUN/stdout" &
TAILS+=($!)
tail -n +1 -s 0.2 --pid="$QPID" -f "$RUN/stderr" >&2 &
TAILS+=($!)
if [ "$VERBOSE" = 1 ]; then
	tail -n +1 -s 0.2 --pid="$QPID" -f "$RUN/console.log" | sed -u 's/^/[vm] /' >&2 &
	TAILS+=($!)
fi

qrc=0
wait "$QPID" || qrc=$?
QPID=''
for p in "${TAILS[@]}"; do wait "$p" 2>/dev/null || true; done
TAILS=()
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

console_tail() {
	local first
	first=$(grep -n -m1 -E 'Kernel panic|BUG:|Oops|general protection' "$RUN/console.log" | cut -d: -f1)
	if [ -n "$first" ]; then
		say "guest console from the first error ($RUN/console.log):"
		tail -n +"$((first > 5 ? first - 5 : 1))" "$RUN/console.log" | head -n 60 | sed 's/^/  | /' >&2
	else
		say "last lines of the guest console ($RUN/console.log):"
		tail -n 40 "$RUN/console.log" | sed 's/^/  | /' >&2
	fi
	if [ -s "$RUN/qemu.log" ]; then
		say "qemu said:"
		sed 's/^/  | /' "$RUN/qemu.log" >&2
	fi
	KEEP=1
}

if [ -f "$RUN/rc" ]; then
	rc=$(cat "$RUN/rc")
	[ "$VERBOSE" = 1 ] && say "VM done in ${elapsed}s, command exit status $rc"
	exit "$rc"
fi
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
	if [ -f "$RUN/started" ]; then
		say "timeout: the command did not finish within ${TIMEOUT}s; VM killed"
	else
		say "timeout: the VM did not reach the command within ${TIMEOUT}s; VM killed"
		console_tail
	fi
	exit 124
fi
if [ -f "$RUN/setup-failed" ]; then
	say "VM harness setup failed: $(cat "$RUN/setup-failed")"
	console_tail
	exit 125
fi
if grep -q 'Kernel panic' "$RUN/console.log"; then
	say "the guest kernel panicked after ${elapsed}s"
elif [ -f "$RUN/started" ]; then
	say "the VM stopped while the command was running (qemu status $qrc, ${elapsed}s)"
else
	say "the VM failed before the command started (qemu status $qrc, ${elapsed}s)"
fi
console_tail
exit 125
