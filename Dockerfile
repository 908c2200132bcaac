# syntax=docker/dockerfile:1
# The operator's image: the nodegroup-operator binary alone on distroless (glibc, libgcc, CA
# roots), as user 65532. `make image` builds it for this machine (PLATFORM=linux/arm64 for
# another architecture); .github/workflows/release.yaml builds linux/amd64 and linux/arm64 with
# docker buildx. Builds with BuildKit (docker 23+) or buildah (podman, buildah).
#
# - Multi-arch without emulation: the build stages run on the build machine's platform
#   ($BUILDPLATFORM) and cross-compile for $TARGETARCH with Debian's cross gcc (ring's C and
#   assembly, and the link); only the last stage is of the target platform.
# - Layers: the dependency graph is built first from the workspace's manifests and Cargo.lock
#   with stub sources (the `skeleton` stage extracts them), so a source change rebuilds the
#   workspace's own crates only.
# - Base images: Rust by exact version tag; distroless publishes no version tags, only `nonroot`.
#   To pin digests, pass --build-arg BUILD_IMAGE=...@sha256:... and RUNTIME_IMAGE=...@sha256:...
#   (the release workflow resolves both at release time, and labels the image with the
#   runtime's; its provenance attestation records the build arguments).
# - Only the operator binary is shipped: the sandbox and testbed crates (workspace members, the
#   operator's dev-dependencies) enter the build as their manifests with stub sources, tests and
#   docs not at all (.dockerignore).
ARG BUILD_IMAGE=docker.io/library/rust:1.95.0-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# --- The workspace's manifests, Cargo.lock, build script and proto, with stub sources: the
# only input of the dependency layer (COPY compares contents, not times).
FROM --platform=$BUILDPLATFORM ${BUILD_IMAGE} AS skeleton
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY . .
RUN set -eu; \
    mkdir -p /skeleton; \
    cp Cargo.toml Cargo.lock /skeleton/; \
    cp -r proto /skeleton/proto; \
    for manifest in $(find . -maxdepth 3 -name Cargo.toml -not -path ./Cargo.toml | sort); do \
      dir=$(dirname "$manifest"); \
      mkdir -p "/skeleton/$dir/src"; \
      cp "$manifest" "/skeleton/$dir/"; \
      if [ -f "$dir/build.rs" ]; then cp "$dir/build.rs" "/skeleton/$dir/"; fi; \
    done; \
    for dir in . $(find . -maxdepth 3 -name Cargo.toml -not -path ./Cargo.toml -exec dirname {} \;); do \
      mkdir -p "/skeleton/$dir/src"; \
      if [ ! -d "$dir/src" ] || [ -f "$dir/src/lib.rs" ]; then : > "/skeleton/$dir/src/lib.rs"; fi; \
      if [ ! -d "$dir/src" ] || [ -f "$dir/src/main.rs" ]; then echo 'fn main() {}' > "/skeleton/$dir/src/main.rs"; fi; \
    done; \
    find /skeleton -exec touch -h -d @0 {} +

# --- The build, on the build machine's platform, for TARGETARCH.
FROM --platform=$BUILDPLATFORM ${BUILD_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TARGETARCH
WORKDIR /src
# The Rust target and, when it is not this machine's, Debian's cross toolchain (the versions of
# the base image's Debian release); /cargo-env carries the choice to the build steps.
# TARGETARCH is empty without BuildKit: this machine's.
# hadolint ignore=DL3008
RUN set -eu; \
    native=$(dpkg --print-architecture); \
    arch=${TARGETARCH:-$native}; \
    case "$arch" in \
      amd64) triple="x86_64-unknown-linux-gnu"; gnu="x86_64-linux-gnu"; gcc="gcc-x86-64-linux-gnu" ;; \
      arm64) triple="aarch64-unknown-linux-gnu"; gnu="aarch64-linux-gnu"; gcc="gcc-aarch64-linux-gnu" ;; \
      *) echo "TARGETARCH=$arch is not supported (amd64, arm64)" >&2; exit 1 ;; \
    esac; \
    echo "export TRIPLE=$triple" > /cargo-env; \
    if [ "$arch" != "$native" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends "$gcc" "libc6-dev-$arch-cross"; \
      rm -rf /var/lib/apt/lists/*; \
      rustup target add "$triple"; \
      upper=$(echo "$triple" | tr 'a-z-' 'A-Z_'); \
      lower=$(echo "$triple" | tr '-' '_'); \
      { echo "export CARGO_TARGET_${upper}_LINKER=$gnu-gcc"; \
        echo "export CC_${lower}=$gnu-gcc"; \
        echo "export AR_${lower}=$gnu-ar"; } >> /cargo-env; \
    fi
# Dependencies (and the workspace's crates as stubs), from the skeleton only.
COPY --from=skeleton /skeleton/ ./
RUN set -eu; . /cargo-env; \
    cargo build --release --locked --target "$TRIPLE" -p nodegroup-operator --bin nodegroup-operator
# The sources. Touched: cargo must see them newer than the stubs it built.
COPY src src
COPY crates crates
RUN set -eu; . /cargo-env; \
    find src crates -name '*.rs' -exec touch {} +; \
    cargo build --release --locked --target "$TRIPLE" -p nodegroup-operator --bin nodegroup-operator; \
    cp "target/$TRIPLE/release/nodegroup-operator" /nodegroup-operator

# --- The image: the binary alone.
FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=""
ARG SOURCE=https://github.com/nodegroup-dev/nodegroup-operator
LABEL org.opencontainers.image.title="nodegroup-operator" \
      org.opencontainers.image.description="cluster-autoscaler externalgrpc cloud provider for Cluster API node groups, as a Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
COPY --from=build /nodegroup-operator /usr/local/bin/nodegroup-operator
USER 65532:65532
EXPOSE 8086 8080
ENTRYPOINT ["/usr/local/bin/nodegroup-operator"]
CMD ["run"]
