#!/usr/bin/env bash
# prepare.sh - idempotent, cached setup for the rkv Soft-RoCE (rxe) VM harness.
#
# Installs the host packages the harness needs (only those missing), fetches
# Debian's own kernel (the -unsigned image package that linux-image-amd64
# currently depends on) without installing it, unpacks it into a cache dir,
# runs depmod on it and builds a small busybox initramfs that reaches the host
# filesystem over virtio-9p + overlayfs.  See docs/RXE-VM.md.
#
# Usage: bash deploy/rxevm/prepare.sh [--force]
#   --force   rebuild the initramfs (and re-run depmod) even if cached
#
# Environment:
#   RKV_VM_CACHE  cache dir (default: $HOME/.cache/rkv/rxevm)
#   RKV_VM_KVER   use this kernel ABI (e.g. 6.1.0-57-amd64) instead of the one
#                 linux-image-amd64 depends on
#
# When everything is cached this downloads nothing and takes about a second.
set -euo pipefail

CACHE=${RKV_VM_CACHE:-${HOME:-/root}/.cache/rkv/rxevm}
FORCE=0

# Bump when the initramfs layout or its init script changes.
INITRAMFS_VERSION=3

# Host packages the harness (and the tests it runs) needs.
PACKAGES=(
	qemu-system-x86 busybox-static kmod iproute2 cpio gzip xz-utils zstd
	rdma-core ibverbs-utils ibverbs-providers libibverbs-dev
	librdmacm-dev rdmacm-utils perftest
)

# Modules the initramfs loads to reach the host root (dependencies are
# resolved with modprobe --show-depends, in dependency order).
INITRAMFS_MODULES=(virtio_pci 9pnet_virtio 9p overlay)

log() { printf 'rxevm prepare: %s\n' "$*" >&2; }
die() { printf 'rxevm prepare: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case $1 in
	--force) FORCE=1 ;;
	-h | --help)
		awk 'NR == 1 || /^# shellcheck/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
		exit 0
		;;
	*) die "unknown argument: $1" ;;
	esac
	shift
done

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, qemu with 9p security_model=none)"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported"

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update_once() {
	if [ "$APT_UPDATED" = 0 ]; then
		log "apt-get update"
		apt-get update -qq >&2 || die "apt-get update failed"
		APT_UPDATED=1
	fi
}

# ---------------------------------------------------------------- packages
missing=()
declare -A pkg_status=()
while read -r p st; do
	pkg_status[$p]=$st
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
for p in "${PACKAGES[@]}"; do
	[ "${pkg_status[$p]:-}" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	apt_update_once
	log "apt-get install ${missing[*]}"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install failed"
fi

for t in qemu-system-x86_64 depmod modprobe cpio gzip; do
	command -v "$t" >/dev/null || die "$t not found after install"
done
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing (busybox-static)"

# ------------------------------------------------------- kernel ABI version
# apt-cache takes about a second here (no pkgcache.bin), so remember the
# answer for as long as the apt lists are unchanged.
apt_lists_stamp() {
	stat -c '%n %s %Y' /var/lib/apt/lists/*_Packages* 2>/dev/null | sha256sum | cut -c1-16
}
resolve_kver() {
	local stamp kver
	stamp=$(apt_lists_stamp)
	if [ -f "$CACHE/kver.cache" ] && [ "$(cut -d' ' -f1 "$CACHE/kver.cache")" = "$stamp" ]; then
		cut -d' ' -f2 "$CACHE/kver.cache"
		return
	fi
	kver=$(apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1)
	if [ -n "$kver" ]; then
		printf '%s %s\n' "$stamp" "$kver" >"$CACHE/kver.cache"
	fi
	printf '%s\n' "$kver"
}

mkdir -p "$CACHE"
KVER=${RKV_VM_KVER:-}
if [ -z "$KVER" ]; then
	KVER=$(resolve_kver)
	if [ -z "$KVER" ]; then
		if [ -f "$CACHE/current.env" ]; then
			# Offline / no apt lists: keep using what is cached.
			KVER=$(sed -n 's/^KVER=//p' "$CACHE/current.env")
			log "linux-image-amd64 not resolvable; using cached kernel $KVER"
		else
			apt_update_once
			KVER=$(resolve_kver)
		fi
	fi
fi
[ -n "$KVER" ] || die "cannot resolve the kernel ABI from linux-image-amd64"
case $KVER in *[!A-Za-z0-9.+_-]*) die "odd kernel version: $KVER" ;; esac

KDIR=$CACHE/kernel-$KVER
MODDIR=$KDIR/lib/modules/$KVER
VMLINUZ=$KDIR/boot/vmlinuz-$KVER
INITRD=$CACHE/initramfs-$KVER.cpio.gz

# ------------------------------------------------- download + unpack kernel
if [ ! -f "$KDIR/.complete" ]; then
	pkg=linux-image-$KVER-unsigned
	dl=$CACHE/download
	rm -rf "$dl" "$KDIR"
	mkdir -p "$dl"
	log "downloading $pkg (about 70 MB)"
	if ! (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2); then
		apt_update_once
		(cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2) ||
			die "apt-get download $pkg failed"
	fi
	deb=$(find "$dl" -maxdepth 1 -name '*.deb' | head -n1)
	[ -n "$deb" ] || die "no .deb downloaded for $pkg"
	log "unpacking $(basename "$deb")"
	mkdir -p "$KDIR.tmp"
	dpkg -x "$deb" "$KDIR.tmp"
	# Keep only the kernel image and its modules.
	mkdir -p "$KDIR/boot" "$KDIR/lib/modules"
	mv "$KDIR.tmp/boot/vmlinuz-$KVER" "$KDIR/boot/"
	mv "$KDIR.tmp/lib/modules/$KVER" "$KDIR/lib/modules/"
	rm -rf "$KDIR.tmp" "$dl"
	log "depmod $KVER"
	depmod -b "$KDIR" "$KVER"
	touch "$KDIR/.complete"
elif [ "$FORCE" = 1 ] || [ ! -s "$MODDIR/modules.dep" ]; then
	log "depmod $KVER"
	depmod -b "$KDIR" "$KVER"
fi
[ -f "$VMLINUZ" ] || die "$VMLINUZ missing; remove $KDIR and re-run"
[ -f "$MODDIR/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
	ls "$MODDIR"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1 ||
	die "this kernel has no rdma_rxe module"

# ------------------------------------------------ uncompressed PVH kernel
# Under TCG, decompressing the (xz) bzImage costs about 3 s per boot.  qemu
# boots an uncompressed vmlinux directly through its PVH entry point, so
# extract it once.  Falls back to the bzImage if that is not possible.
VMLINUX=$KDIR/boot/vmlinux-$KVER
extract_vmlinux() { # bzImage -> vmlinux (ELF with the Xen PVH entry note)
	local img=$1 out=$2 magic tool off
	for magic in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
		tool=${magic%%:*}
		command -v "$tool" >/dev/null || continue
		for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$img" | cut -d: -f1 | head -n 5); do
			tail -c +$((off + 1)) "$img" | "$tool" -dc 2>/dev/null >"$out.tmp" || true
			if [ "$(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
				LC_ALL=C grep -qaP '\x04\x00\x00\x00[\x04\x08]\x00\x00\x00\x12\x00\x00\x00Xen\x00' "$out.tmp"; then
				mv "$out.tmp" "$out"
				return 0
			fi
		done
	done
	rm -f "$out.tmp"
	return 1
}
BOOTKERNEL=$VMLINUZ
if [ -s "$VMLINUX" ]; then
	BOOTKERNEL=$VMLINUX
elif [ ! -f "$KDIR/.no-pvh" ]; then
	log "extracting an uncompressed PVH vmlinux (faster boot under TCG)"
	if extract_vmlinux "$VMLINUZ" "$VMLINUX"; then
		BOOTKERNEL=$VMLINUX
	else
		log "no PVH vmlinux in $VMLINUZ; booting the bzImage"
		touch "$KDIR/.no-pvh"
	fi
fi

# --------------------------------------------------------------- initramfs
# The init script of the initramfs.  It loads the modules listed in
# /modules.order, mounts the host root (9p, read-only) under a tmpfs overlay
# at /newroot, mounts the per-run share (rw) at its host path inside it, and
# runs the per-run stage-2 script (guest.sh, from that share) with chroot.
# PID 1 stays in the initramfs so that /sbin/rkv-modprobe (the kernel's
# module helper, which runs outside the chroot) can chroot into /newroot.
read -r -d '' INIT_SCRIPT <<'EOF' || true
#!/bin/busybox sh
# rkv rxe VM stage 1 (generated by deploy/rxevm/prepare.sh)
export PATH=/bin
fail() {
	echo "rkv-vm: stage1: $*" >/dev/console
	[ -n "$run" ] && [ -d "/newroot$run" ] && echo "stage1: $*" >"/newroot$run/setup-failed"
	sync
	poweroff -f
	sleep 5
	echo o >/proc/sysrq-trigger
}
run=
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for a in $(cat /proc/cmdline); do
	case $a in rkvrun=*) run=${a#rkvrun=} ;; esac
done
while read -r m; do
	insmod "/modules/$m" || fail "insmod $m failed"
done </modules.order
mkdir -p /lower /rw /newroot
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /lower ||
	fail "cannot mount the host root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
	fail "cannot mount the overlay"
[ -n "$run" ] || fail "no rkvrun= on the kernel command line"
mkdir -p "/newroot$run"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rkvrun "/newroot$run" ||
	fail "cannot mount the run share"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
echo /sbin/rkv-modprobe >/proc/sys/kernel/modprobe
chroot /newroot /bin/bash "$run/guest.sh" "$run" </dev/null >/dev/console 2>&1
echo "rkv-vm: stage2 exited with status $?" >/dev/console
sync
poweroff -f
sleep 5
echo o >/proc/sysrq-trigger
EOF

read -r -d '' MODPROBE_WRAPPER <<'EOF' || true
#!/bin/busybox sh
# The kernel's module helper runs outside the chroot: run kmod's modprobe
# (with the module tree bind-mounted by guest.sh) inside it.
exec /bin/busybox chroot /newroot /sbin/modprobe "$@"
EOF

# Resolve the initramfs module list (dependency order, deduplicated).
mod_list() {
	local m line path
	declare -A seen=()
	for m in "${INITRAMFS_MODULES[@]}"; do
		while read -r line; do
			case $line in
			insmod\ *)
				path=${line#insmod }
				path=${path%% *}
				if [ -z "${seen[$path]:-}" ]; then
					seen[$path]=1
					printf '%s\n' "$path"
				fi
				;;
			builtin\ *) ;;
			*) ;;
			esac
		done < <(modprobe -d "$KDIR" -S "$KVER" --show-depends "$m")
	done
}

MODS=$(mod_list)
[ -n "$MODS" ] || die "modprobe --show-depends found no modules"
STAMP=$(printf '%s\n%s\n%s\n%s\n%s\n' "$INITRAMFS_VERSION" "$INIT_SCRIPT" \
	"$MODPROBE_WRAPPER" "$MODS" "$(dpkg-query -W -f='${Version}' busybox-static)" |
	sha256sum | cut -d' ' -f1)

if [ "$FORCE" = 1 ] || [ ! -s "$INITRD" ] || [ "$(cat "$INITRD.stamp" 2>/dev/null)" != "$STAMP" ]; then
	log "building initramfs for $KVER"
	st=$CACHE/initramfs.staging
	rm -rf "$st"
	mkdir -p "$st"/{bin,sbin,proc,sys,dev,modules,lower,rw,newroot}
	cp "$BUSYBOX" "$st/bin/busybox"
	for a in sh mount insmod mkdir chroot poweroff cat echo sleep sync; do
		ln -s busybox "$st/bin/$a"
	done
	printf '%s\n' "$INIT_SCRIPT" >"$st/init"
	printf '%s\n' "$MODPROBE_WRAPPER" >"$st/sbin/rkv-modprobe"
	chmod 755 "$st/init" "$st/sbin/rkv-modprobe"
	: >"$st/modules.order"
	while read -r path; do
		name=$(basename "$path")
		case $name in
		*.ko) cp "$path" "$st/modules/$name" ;;
		*.ko.xz) xz -dc "$path" >"$st/modules/${name%.xz}"; name=${name%.xz} ;;
		*.ko.zst) zstd -qdc "$path" >"$st/modules/${name%.zst}"; name=${name%.zst} ;;
		*.ko.gz) gzip -dc "$path" >"$st/modules/${name%.gz}"; name=${name%.gz} ;;
		*) die "unexpected module file $path" ;;
		esac
		printf '%s\n' "$name" >>"$st/modules.order"
	done <<<"$MODS"
	(cd "$st" && find . -print0 | LC_ALL=C sort -z |
		cpio --null -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
	printf '%s\n' "$STAMP" >"$INITRD.stamp"
	rm -rf "$st"
	log "initramfs: $(du -h "$INITRD" | cut -f1), modules: $(xargs -n1 basename <<<"$MODS" | tr '\n' ' ')"
fi

cat >"$CACHE/current.env.tmp" <<EOF
KVER=$KVER
KERNEL=$BOOTKERNEL
INITRD=$INITRD
MODDIR=$MODDIR
EOF
mv "$CACHE/current.env.tmp" "$CACHE/current.env"
log "ready: kernel $KVER, cache $CACHE"
