# nodegroup-operator. `make test` builds the pinned upstream peers it needs (cached under
# target/upstream/) and runs every test; `make demo` runs the sandbox demo.
SHELL := /bin/bash
CARGO ?= cargo
UPSTREAM := tests/upstream/build.sh
# Upstream peers the tests run against.
TEST_PEERS ?= etcd kube capi kwok helm conformance

.PHONY: all build test unit e2e lint fmt crds upstream demo bench clean-upstream

all: build

build:
	$(CARGO) build --release --locked

upstream:
	$(UPSTREAM) $(TEST_PEERS)

## Every test: unit, integration against a real kube-apiserver, and the rest under tests/.
test: upstream
	$(CARGO) test --locked

## End to end with the real Cluster API manager, kwok and a test infrastructure provider.
e2e: upstream
	$(CARGO) test --locked --test e2e_capi

unit:
	$(CARGO) test --locked --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Read-path benchmark at 1,000 groups / 10,000 nodes; writes target/bench/index.json.
bench:
	$(CARGO) bench --locked --bench index

crds:
	$(CARGO) run --quiet -- crd > crds/nodegroup-operator.yaml
	cp crds/nodegroup-operator.yaml charts/nodegroup-operator/crds/nodegroup-operator.yaml

clean-upstream:
	rm -rf target/upstream

## The sandbox demo needs the real cluster-autoscaler, which the module proxy here does not serve.
demo:
	@if ! tests/upstream/build.sh cluster-autoscaler; then \
	  echo ""; \
	  echo "make demo: cannot build cluster-autoscaler from the Go module proxy (see tests/upstream/NOTES.md)."; \
	  echo "The demo drives the real cluster-autoscaler and does not substitute anything for it."; \
	  exit 1; \
	fi
	@echo "make demo: cluster-autoscaler is available, but the demo sandbox is not implemented yet."; exit 1
