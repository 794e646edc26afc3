#!/usr/bin/env bash
# The rkv demo on real Soft-RoCE (make demo-rxe): builds the commands with the
# verbs provider, boots ONE qemu VM (deploy/rxevm) with 4 rxe devices on veth
# pairs joined by a bridge, and runs deploy/demo/demo-rxe-guest.sh in it:
# 3 rkv-server nodes on rxe0..rxe2, rkv-client on rxe3, the scripted session
# of `make demo`, a check that GETs are one-sided RDMA_READs (rxe counters
# move, server handlers do not) and a clean SIGTERM stop.
#
# Why one VM: rxe in Debian's 6.1 kernel does not carry traffic across network
# namespaces, and one VM per node (qemu socket network) under TCG on 2 host
# cores is much slower: see README.md "make demo-rxe".
#
# Environment: RKV_DEMO_GETS (GET-only phase size, default 40),
# RKV_DEMO_TIMEOUT (VM wall clock, default 600 s); run.sh's RKV_VM_* apply.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s%N)
GO=${GO:-go}

echo "== building the commands with the verbs provider (bin/verbs/)"
"$GO" build -tags verbs -o bin/verbs/ ./cmd/...

echo "== preparing the rxe VM (cached after the first time)"
bash deploy/rxevm/prepare.sh

echo "== booting the VM: 4 rxe devices, the demo runs inside"
rc=0
bash deploy/rxevm/run.sh --rxe 4 --timeout "${RKV_DEMO_TIMEOUT:-600}" \
	--env "RKV_DEMO_BIN=$PWD/bin/verbs" --env "RKV_DEMO_GETS=${RKV_DEMO_GETS:-40}" \
	-- bash deploy/demo/demo-rxe-guest.sh || rc=$?

ms=$((($(date +%s%N) - start) / 1000000))
if [[ $rc -eq 0 ]]; then
	printf '\ndemo-rxe OK in %d.%ds (build, VM boot, cluster, session, checks, stop)\n' $((ms / 1000)) $((ms % 1000 / 100))
else
	case $rc in
	124) why="the VM hit its timeout" ;;
	125) why="the VM or the rxe harness failed (see above)" ;;
	*) why="the guest script failed" ;;
	esac
	printf '\ndemo-rxe FAILED (exit %d: %s) after %d.%ds\n' "$rc" "$why" $((ms / 1000)) $((ms % 1000 / 100)) >&2
fi
exit "$rc"
