#!/usr/bin/env bash
# Runs every fuzz target of the main module for FUZZTIME each (make fuzz).
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" when a duration -fuzztime ends while a worker is
# mid-call (golang/go#75804, fixed in Go 1.27): no input failed, nothing was
# written. Such a run is retried once; a failure that wrote a reproducer
# (testdata/fuzz/...), or any other failure, fails at once.
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run() { # PKG TARGET
	"$GO" test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" "$1" >"$log" 2>&1
}

# deadline_flake: the run failed only with the coordinator's deadline
# error: no reproducer written, no panic, no t.Error line.
deadline_flake() {
	grep -q 'context deadline exceeded' "$log" &&
		! grep -q -e 'Failing input written to' -e 'panic:' -e '_test\.go:[0-9]*:' "$log"
}

for pkg in $("$GO" list ./...); do
	for f in $("$GO" test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "fuzz $pkg $f ($FUZZTIME)"
		if run "$pkg" "$f"; then
			tail -n 3 "$log"
			continue
		fi
		if deadline_flake; then
			echo "  the Go fuzz coordinator's deadline race (golang/go#75804), no failing input: retrying once"
			if run "$pkg" "$f"; then
				tail -n 3 "$log"
				continue
			fi
		fi
		cat "$log"
		echo "fuzz: $pkg $f FAILED" >&2
		exit 1
	done
done
