#!/bin/bash
# bench-ab.sh [BASE]: builds BASE (a git revision, default HEAD) beside the
# working tree's bin/ (make build) and measures the two side by side with
# bench/cmd/ab. WORKLOAD, CONCURRENCY, PAIRS, SYNC pass through.
set -euo pipefail
base=${1:-HEAD}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/src" 2>/dev/null || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add --quiet --detach "$tmp/src" "$base"
echo "building $base ($(git -C "$root" rev-parse --short "$base")) into $tmp/bin"
(cd "$tmp/src" && go build -o "$tmp/bin/" ./cmd/rkv-server ./cmd/rkv-client)
cd "$root/bench"
go run ./cmd/ab --a "$tmp/bin" --b "$root/bin" --workload "${WORKLOAD:-put}" \
	--concurrency "${CONCURRENCY:-16}" --pairs "${PAIRS:-8}" --sync "${SYNC:-none}"
