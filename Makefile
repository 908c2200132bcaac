# nodegroup-operator. `make test` builds the pinned upstream peers it needs (cached under
# target/upstream/) and runs every test; `make demo` runs the sandbox demo.
SHELL := /bin/bash
CARGO ?= cargo
UPSTREAM := tests/upstream/build.sh
# Upstream peers the tests run against (cluster-autoscaler and the example server are built from
# the source in ../shared/upstream; the rest from the Go module proxy).
TEST_PEERS ?= etcd kube capi kwok helm ca-source ecosystem-crds cluster-autoscaler cluster-autoscaler-test example-server conformance cherry-check alicloud-check clusterapi-diff
# What `make demo` needs.
DEMO_PEERS ?= etcd kube capi kwok cluster-autoscaler
# What `make bench` needs (CA 1.34.5 twice: its externalgrpc binary, and its in-tree clusterapi
# provider, a build of its own before 1.36; CA 1.36.1 built with each patch of
# tests/upstream/patches/ alone, docs/upstream.md).
BENCH_PEERS ?= etcd kube capi cluster-autoscaler example-server cluster-autoscaler-1.34.5 cluster-autoscaler-clusterapi-1.34.5 cluster-autoscaler-patched

.PHONY: all build test unit e2e safety soak chaos lint fmt crds upstream demo demo-cherry sandbox bench bench-loop scale fuzz clean-upstream compat

all: build

build:
	$(CARGO) build --release --locked

## The operator's image, tagged $(IMAGE):$(VERSION) (VERSION: the crate's, the chart's appVersion),
## with docker (BuildKit), podman or buildah, the first one installed (CONTAINER_TOOL=podman to
## choose); PLATFORM=linux/arm64 builds for another architecture. Push it with the same tool.
IMAGE ?= ghcr.io/nodegroup-dev/nodegroup-operator
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
CONTAINER_TOOL ?= $(firstword $(foreach tool,docker podman buildah,$(if $(shell command -v $(tool) 2>/dev/null),$(tool))))
.PHONY: image
image:
	@if [ -z "$(CONTAINER_TOOL)" ]; then \
	  echo "make image: no container tool found: install docker (with BuildKit), podman or buildah, or name one with CONTAINER_TOOL=..." >&2; exit 1; \
	fi
	@command -v "$(CONTAINER_TOOL)" >/dev/null || { echo "make image: CONTAINER_TOOL=$(CONTAINER_TOOL) is not installed" >&2; exit 1; }
	@if [ "$(CONTAINER_TOOL)" = docker ] && ! docker info >/dev/null 2>&1; then \
	  echo "make image: docker is installed but its daemon does not answer (docker info): start it, or use CONTAINER_TOOL=podman or buildah" >&2; exit 1; \
	fi
	$(CONTAINER_TOOL) build $(if $(PLATFORM),--platform=$(PLATFORM)) \
	  --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
	  -t $(IMAGE):$(VERSION) -f Dockerfile .

upstream:
	$(UPSTREAM) $(TEST_PEERS)

## Every test: unit, integration against a real kube-apiserver, and the rest under tests/.
test: upstream
	$(CARGO) test --locked --workspace --features nodegroup-operator/fault-injection

## Safety under crashes, timeouts, rollouts, concurrency and API server faults: the scale-down
## protocol's model at a larger bound, and 200 rounds of scale-down through the fault proxy.
NGO_FAULT_ROUNDS ?= 200
safety: upstream
	$(CARGO) test --locked -p ngo-index --lib protocol_model -- --include-ignored
	NGO_FAULT_ROUNDS=$(NGO_FAULT_ROUNDS) $(CARGO) test --locked --features fault-injection --test safety

## End to end with the real Cluster API manager, kwok and a test infrastructure provider, and
## NodePools on the Cherry Servers and Alibaba Cloud emulators with the real cluster-autoscaler.
e2e: upstream
	$(CARGO) test --locked --features nodegroup-operator/fault-injection --test e2e_capi --test e2e_ca --test clouds

unit:
	$(CARGO) test --locked --workspace --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets --features nodegroup-operator/fault-injection -- -D warnings
	$(CARGO) check --locked --manifest-path fuzz/Cargo.toml --target-dir target/fuzz-check

fmt:
	$(CARGO) fmt --all

## The compatibility matrix (docs/compatibility.md): builds CA's externalgrpc client of every
## release in CONFORMANCE_ALL_VERSIONS and the cluster-autoscaler binary of every release in
## CA_BINARY_ALL_VERSIONS (tests/upstream/versions.env), runs the conformance scenarios through
## each client and a scale-up-and-down through each binary, and rewrites both generated tables;
## fails if a release fails. Not part of `make test`, which checks the rows of the test releases
## (clients 1.29.5, 1.34.1, 1.36.1; binaries 1.29.5, 1.36.1).
.PHONY: compat
compat:
	$(UPSTREAM) etcd kube capi conformance-all
	NGO_COMPAT=1 $(CARGO) test --locked --test operator conformance::compat_matrix -- --nocapture
	$(UPSTREAM) kwok cluster-autoscaler-all && NGO_COMPAT=1 $(CARGO) test --locked --features nodegroup-operator/fault-injection --test e2e_ca compat_ca_binaries -- --nocapture

## Side by side with the upstream peers (CA's example externalgrpc server, CA's in-tree clusterapi
## provider) on fresh API servers, same load client for all: optimized builds of ours and theirs;
## cluster-autoscaler 1.36.1 (and 1.34.5, and 1.36.1 with each patch of docs/upstream.md) through
## ours remote, co-located and the relay and in-tree, in interleaved rounds. Prints the tables and
## writes target/bench/results.json; about two and a half hours on 2 cores, not part of `make test`
## (which runs `ngo-sandbox bench --smoke`).
bench:
	$(UPSTREAM) $(BENCH_PEERS)
	$(CARGO) build --release --locked -p ngo-sandbox -p nodegroup-operator --bins
	./target/release/ngo-sandbox bench

## cluster-autoscaler's loop alone on bench's main dataset at 0.25 ms each way, in its rounds (ours
## remote, co-located, through the relay, in-tree, and ours remote with CA 1.36.1 built with each
## patch of docs/upstream.md): the loop's ratios, the relay's memory and what each patch gives in
## about an hour (56 minutes on 2 cores on 2026-11-28); writes target/bench/loop-goals.json.
bench-loop:
	$(UPSTREAM) etcd kube capi cluster-autoscaler example-server cluster-autoscaler-patched
	$(CARGO) build --release --locked -p ngo-sandbox -p nodegroup-operator --bins
	./target/release/ngo-sandbox bench --loop-goals --out target/bench/loop-goals.json

## The management topology at scale (ngo_sandbox::scale): one operator reading 10, 100 and 1,000
## workload clusters of 10 Nodes (stand-in API servers, through its real client) from their
## kubeconfig Secrets, then serving 1, 100 and 1,000 relay streams: memory, CPU, sync time and
## Node change latency, judged against issue 36's goals. Optimized builds; prints the tables and
## writes target/scale/results.json; about 10 minutes on 2 cores, not part of `make test` (which
## runs `ngo-sandbox scale --smoke`).
scale:
	$(UPSTREAM) etcd kube capi
	$(CARGO) build --release --locked -p ngo-sandbox -p nodegroup-operator --bins
	./target/release/ngo-sandbox scale

## Fuzz the gRPC request decoders and the pure request handling (fuzz/; not part of `make test`).
## Needs a nightly toolchain and cargo-fuzz (`rustup toolchain install nightly --profile minimal`,
## `cargo install cargo-fuzz`). Runs for FUZZ_SECONDS; findings land in fuzz/artifacts/.
FUZZ_SECONDS ?= 300
FUZZ_TARGET ?= grpc_requests
fuzz:
	$(CARGO) +nightly fuzz run $(FUZZ_TARGET) -- -max_total_time=$(FUZZ_SECONDS) -max_len=4096

crds:
	$(CARGO) run --quiet -- crd > crds/nodegroup-operator.yaml
	cp crds/nodegroup-operator.yaml charts/nodegroup-operator/crds/nodegroup-operator.yaml

clean-upstream:
	rm -rf target/upstream

## The demo: sandbox, operator and the real cluster-autoscaler; a MachineDeployment scales up and
## down. Live table on a terminal, plain lines otherwise (`make demo DEMO_FLAGS=--plain`).
demo:
	@echo "--- building the upstream peers (first run only: about 10 minutes on 2 cores)"
	$(UPSTREAM) $(DEMO_PEERS)
	@echo "--- building nodegroup-operator and ngo-sandbox"
	$(CARGO) build --locked --workspace --bins
	./target/debug/ngo-sandbox demo $(DEMO_FLAGS)

## The same with a NodePool of servers on the Cherry Servers emulator.
demo-cherry:
	$(MAKE) demo DEMO_FLAGS="$(DEMO_FLAGS) --cherry"

## 10 minutes of mixed reads and writes from many clients against the operator binary on the
## sandbox, 5% of its writes faulted by the fault proxy (SOAK_FAULT_RATE), every DeleteNodes judged
## by the deletion auditor; writes target/soak/results.json. `make test` runs a 45-second seeded
## round (tests/safety/soak.rs).
soak:
	$(UPSTREAM) $(DEMO_PEERS)
	$(CARGO) build --locked --workspace --bins
	./target/debug/ngo-sandbox soak --minutes $${SOAK_MINUTES:-10} --fault-rate $${SOAK_FAULT_RATE:-0.05}

## Chaos with the real cluster-autoscaler 1.36.1 deciding (ngo_sandbox::chaos): CHAOS_MINUTES
## (30) of MachineDeployments, a MachinePool and a NodePool under workloads coming and going,
## and seeded outside actions (CHAOS_SEED, random when unset), every Machine deletion and
## NodePool Node removal judged by CA's own answers; fails on any U1 violation or fewer than
## CHAOS_MIN_SCALE_DOWNS (100) scale-downs. Writes target/chaos/results.json. `make test` runs a
## short seeded round (tests/e2e_ca.rs).
chaos:
	$(UPSTREAM) $(DEMO_PEERS)
	$(CARGO) build --locked --workspace --bins
	./target/debug/ngo-sandbox chaos --minutes $${CHAOS_MINUTES:-30} --min-scale-downs $${CHAOS_MIN_SCALE_DOWNS:-100} $${CHAOS_SEED:+--seed $$CHAOS_SEED}

## A sandbox that stays up (Ctrl-C or `./target/debug/ngo-sandbox down` stops it).
sandbox:
	$(UPSTREAM) $(DEMO_PEERS)
	$(CARGO) build --locked --workspace --bins
	./target/debug/ngo-sandbox up
