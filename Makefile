# rkv — build, test, lint, benchmark. `make help` lists the targets.
GO       ?= go
PKGS     ?= ./...
BIN      := bin
TESTTIME ?= 10m
FUZZTIME ?= 10s
IDLE_POLL ?= 200us

.PHONY: help build test test-allocs test-short test-chaos test-soak lint fmt bench bench-once bench-grow bench-compare bench-ab bench-rxe fuzz demo demo-rxe demo-up demo-down demo-rdma test-rxe test-vm vm-prepare clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build the commands into bin/
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/... ./examples/...

test: ## the test suite: every package, race detector on (the README's test command)
	$(GO) test -race -timeout $(TESTTIME) $(PKGS)

test-allocs: ## the allocation counts of the hot paths (TestXxxAllocs), without the race detector, which changes them
	$(GO) test -run 'Allocs' -count 1 $(PKGS)

test-short: ## quick tests (skips the large-region cases)
	$(GO) test -short -timeout $(TESTTIME) $(PKGS)

test-chaos: ## chaos suite: 3 servers (and 5 at three replicas) under kill -9, SIGSTOP, partitions (netns as root), and kill -9 of the hot keys' primary then of a second server once re-replicated; history checked for linearizability (CHAOS_DURATION, CHAOS_SEED, CHAOS_NET; docs/CHAOS.md)
	$(GO) test -race -tags chaos -run Chaos -v -count 1 -timeout 20m ./chaos/

test-soak: ## space under load: 1,000 CLI puts into one 64 MiB arena, overwrites of 80% and 90% of the capacity until 20x it is written, 10 million keys growing the index from 2^18 slots; re-replication's MiB/s, 128 MiB at R=2 on 3 servers, one server's backups dropped and added again (~6 min; the 50% soak runs in make test, with -race)
	$(GO) test -tags soak -run 'Thousand|SustainableUtilization|TenMillionKeys|ReReplication' -v -count 1 -timeout 20m ./store/ ./e2e/ ./server/

lint: ## gofmt and go vet (with and without the verbs and chaos tags, and the bench module)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags chaos ./chaos/
	$(GO) vet -tags soak ./store/ ./e2e/ ./server/
	cd bench && $(GO) vet ./...
	@if [ -f /usr/include/infiniband/verbs.h ]; then $(GO) vet -tags verbs $(PKGS); else echo "libibverbs-dev not installed: skipping go vet -tags verbs"; fi

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

bench: ## benchmarks: soft vs raw TCP, registrar (8 x 1 GiB), index, commit, restart, client GET/PUT vs echo
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./rdma/... ./store/... ./client/...

bench-once: ## every benchmark of make bench run once, short, so that none breaks unnoticed (~2 min)
	$(GO) test -run '^$$' -bench . -benchtime 1x -short -count 1 ./rdma/... ./store/... ./client/...

bench-grow: ## migration: a 4th server takes its share of 1e6 keys of 1 KiB under a get/put load (RKV_BENCH_GROW_KEYS; ~2 min)
	$(GO) test -run '^$$' -bench Grow -benchtime 1x -count 1 -timeout 30m ./server/

bench-compare: build ## rkv vs Redis vs raw TCP echo, registration, scaling: regenerates docs/BENCHMARKS.md and its plots (~17 min; needs redis-server; in a guest, idle CPUs poll IDLE_POLL before halting meanwhile)
	cd bench && $(GO) run ./cmd/compare --out ../docs --idle-poll $(IDLE_POLL)

bench-ab: build ## a git revision against the working tree, side by side, runs alternating: BASE=rev (default HEAD), WORKLOAD=put, CONCURRENCY=16, PAIRS=8, SYNC=none (~1 min)
	bash scripts/bench-ab.sh $(BASE)

bench-rxe: vm-prepare ## rkv GET/PUT vs ib_read_lat/ib_write_lat on Soft-RoCE in the VM: writes docs/bench/rxe.md
	bash deploy/rxevm/bench-rxe.sh docs/bench/rxe.md

fuzz: ## run every fuzz target for FUZZTIME each (scripts/fuzz.sh: retries Go 1.26's fuzztime-deadline flake once)
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

demo: build ## the main job: 3 rkv-server processes (soft provider), a scripted rkv-client session, a clean stop
	bash deploy/demo/demo.sh

demo-rxe: vm-prepare ## the demo on real Soft-RoCE: 3 verbs-provider servers + client, 4 rxe devices in one qemu VM, RDMA counters check
	bash deploy/demo/demo-rxe.sh

demo-up: build ## start the 3-server demo cluster and leave it running (state in .demo/)
	bash deploy/demo/demo.sh up

demo-down: ## stop the cluster demo-up started
	bash deploy/demo/demo.sh down

demo-rdma: build ## one-sided RDMA reads from a bare server on the soft provider (examples/rdmaread)
	bash examples/rdmaread/demo.sh

vm-prepare: ## fetch and cache the rxe VM (Debian kernel, qemu, rdma-core)
	bash deploy/rxevm/prepare.sh

test-rxe: vm-prepare ## the verbs provider and the conformance suite on real Soft-RoCE, in a qemu VM
	$(GO) test -tags verbs -c -o $(BIN)/verbs.test ./rdma/verbs/
	bash deploy/rxevm/run.sh --rxe 2 --timeout 1500 -- $(BIN)/verbs.test -test.v -test.timeout 20m
	bash deploy/rxevm/latency.sh $(BIN)/verbs.test

test-vm: vm-prepare ## prove the VM harness itself: rxe devices, perftest, counters
	bash deploy/rxevm/selftest.sh --quick

clean: ## remove built binaries
	rm -rf $(BIN)
