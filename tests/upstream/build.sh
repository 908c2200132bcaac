#!/usr/bin/env bash
# Build the pinned upstream peers (tests/upstream/versions.env) from the Go module proxy into
# target/upstream/. Idempotent: a component whose versioned output already exists is skipped.
#
#   tests/upstream/build.sh                 # all (the list in ALL below)
#   tests/upstream/build.sh etcd kube       # just these
#   tests/upstream/build.sh cluster-autoscaler example-server   # from ../shared/upstream tarballs
#   tests/upstream/build.sh cluster-autoscaler-1.29.5   # the real CA binary of another release;
#                                           # cluster-autoscaler-test: CA_BINARY_TEST_VERSIONS,
#                                           # cluster-autoscaler-all: CA_BINARY_ALL_VERSIONS
#   tests/upstream/build.sh cluster-autoscaler-clusterapi-1.34.5   # that release with the in-tree
#                                           # clusterapi provider alone (before 1.36; make bench)
#   tests/upstream/build.sh cluster-autoscaler-patched   # CA built with each patch of
#                                           # tests/upstream/patches/ alone (make bench; never the
#                                           # product); one: cluster-autoscaler-1.36.1-<patch>
#   tests/upstream/build.sh conformance     # nodegroup-conformance (CA's externalgrpc client) for
#                                           # CONFORMANCE_TEST_VERSIONS; conformance-all: every
#                                           # CONFORMANCE_ALL_VERSIONS; conformance-1.31.5: one
#   tests/upstream/build.sh cherry-check    # cherrygo and CA's in-tree cherryservers provider vs the emulator
#   tests/upstream/build.sh alicloud-check  # CA's in-tree alicloud provider (vendored SDK) vs the emulator
#   tests/upstream/build.sh clusterapi-diff # CA's in-tree clusterapi provider and its externalgrpc client, same questions
#   tests/upstream/build.sh ca-source       # only extract CA's source (its Helm chart, for tests/packaging/chart.rs)
#   tests/upstream/build.sh ecosystem-crds  # prometheus-operator and cert-manager CRDs (tests/packaging/helm.rs)
#   tests/upstream/build.sh --layout        # print the fixed paths only
#
# Output (fixed paths, symlinks into the versioned dirs):
#   target/upstream/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,
#                        capi-manager,cluster-autoscaler(-<CA version>),
#                        cluster-autoscaler-clusterapi-<CA version>,
#                        cluster-autoscaler-<CA version>-<patch>,
#                        externalgrpc-example-server,kwok,helm,
#                        nodegroup-conformance(-<CA version>), cherry-check,
#                        cherry-check-intree, alicloud-check-intree, clusterapi-diff}
#   target/upstream/capi-crds/*.yaml     Cluster API core CRDs
#   target/upstream/kwok-stages/*.yaml   kwok Stage YAMLs (default.yaml = the kwokctl default set)
#   target/upstream/ecosystem-crds/*.yaml ServiceMonitor, PrometheusRule, Certificate, Issuer CRDs
# Versioned: target/upstream/<component>-<version>/bin/...; scratch: target/upstream/work/.
#
# cluster-autoscaler is not served by the Go module proxy: its source comes from the tarballs in
# ../shared/upstream (checksums verified, extracted under target/upstream/work/, never modified);
# its dependencies come from the proxy. The patched builds apply their patch to a copy.
#
# Env: UPSTREAM_OUT (default <repo>/target/upstream), UPSTREAM_JOBS (go build -p, default 2),
#      NGO_SHARED_UPSTREAM (default <repo>/../shared/upstream), NGO_UPSTREAM_ARCHIVES (where a
#      source missing there is downloaded from; default https://codeload.github.com).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

OUT=${UPSTREAM_OUT:-$ROOT/target/upstream}
WORK=$OUT/work
JOBS=${UPSTREAM_JOBS:-2}
SHARED_UPSTREAM=${NGO_SHARED_UPSTREAM:-$ROOT/../shared/upstream}

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
# The checksum database behind the proxy does not know k8s.io/kubernetes v1.36.5 (404) although
# the proxy serves it. Only matters when the wrapper go.sum is (re)generated; afterwards the
# committed go.sum pins the hash and no checksum-database lookup happens.
export GONOSUMDB=${GONOSUMDB:-k8s.io/kubernetes}

ALL=(etcd kube capi kwok helm ca-source ecosystem-crds cluster-autoscaler cluster-autoscaler-test example-server conformance cherry-check alicloud-check clusterapi-diff)

KEY_etcd=etcd-v$ETCD_VERSION
KEY_kube=kube-v$KUBERNETES_VERSION
KEY_capi=capi-v$CAPI_VERSION
KEY_ca=cluster-autoscaler-$CA_VERSION-${CA_COMMIT:0:12}
KEY_example=externalgrpc-example-server-$EXAMPLE_CA_VERSION-${EXAMPLE_CA_COMMIT:0:12}
KEY_kwok=kwok-v$KWOK_VERSION
KEY_helm=helm-v$HELM_VERSION
KEY_ecosystem=ecosystem-crds-po$PROMETHEUS_OPERATOR_VERSION-cm$CERT_MANAGER_VERSION
# nodegroup-conformance, one per CA release (comma-separated lists in versions.env)
IFS=, read -r -a CONFORMANCE_TEST <<<"$CONFORMANCE_TEST_VERSIONS"
IFS=, read -r -a CONFORMANCE_ALL <<<"$CONFORMANCE_ALL_VERSIONS"
# cluster-autoscaler-<version>, the real binary of one CA release (comma-separated lists)
IFS=, read -r -a CA_BINARY_TEST <<<"$CA_BINARY_TEST_VERSIONS"
IFS=, read -r -a CA_BINARY_ALL <<<"$CA_BINARY_ALL_VERSIONS"
# conformance-<version>-<hash of tests/upstream/conformance/{*.go,ca-<version>/go.mod,go.sum} and
# the build tags>: any source change gives a new key and so a rebuild (go's build cache keeps
# that quick).
conformance_key() {
  local h
  h=$( cd "$HERE/conformance" 2>/dev/null && { find . -maxdepth 1 -type f -name '*.go'; \
         find "./ca-$1" -maxdepth 1 -type f \( -name go.mod -o -name go.sum \) 2>/dev/null; } \
      | LC_ALL=C sort | xargs -r sha256sum; conformance_tags "$1" )
  printf 'conformance-%s-%s\n' "$1" "$(sha256sum <<<"$h" | cut -c1-12)"
}

log() { printf '%s\n' "$*" >&2; }
die() { log "build.sh: $*"; exit 1; }

# moddir MODULE@VERSION -> prints the read-only module dir in GOMODCACHE (downloads if needed)
moddir() {
  local j dir
  j=$(cd "$WORK" && go mod download -json "$1") || { log "$j"; die "cannot download $1"; }
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$j")
  [ -n "$dir" ] && [ -d "$dir" ] || { log "$j"; die "no module dir for $1"; }
  printf '%s\n' "$dir"
}
# modfile MODULE@VERSION -> path of the module's go.mod in the download cache (no zip needed)
modfile() {
  local j f
  j=$(cd "$WORK" && go mod download -json "$1" 2>/dev/null) || true
  f=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' <<<"$j")
  [ -n "$f" ] && [ -f "$f" ] || { log "$j"; die "no go.mod for $1"; }
  printf '%s\n' "$f"
}
# copy upstream's `go` and `godebug default=` lines into the wrapper's go.mod (GODEBUG defaults
# come from the main module, so this keeps runtime behaviour as in upstream builds)
copy_go_lines() {
  local up=$1 gov gd
  gov=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$up" | head -1)
  gd=$(sed -n 's/^godebug default=\(.*\)$/\1/p' "$up" | head -1)
  [ -n "$gov" ] && go mod edit -go="$gov"
  [ -n "$gd" ] && go mod edit -godebug="default=$gd"
  return 0
}

# wrapper NAME STAMP GENFN: prepare scratch module $WORK/NAME from tests/upstream/NAME/go.{mod,sum}.
# The first line of the committed go.mod is "// STAMP"; if it differs (versions.env changed) or the
# files are missing, GENFN regenerates them in scratch and they are copied back for committing.
wrapper() {
  local name=$1 stamp=$2 gen=$3 src=$HERE/$1 dst=$WORK/$1
  rm -rf "$dst"; mkdir -p "$dst" "$src"
  if [ -f "$src/go.mod" ] && [ "$(head -1 "$src/go.mod")" = "// $stamp" ]; then
    cp "$src/go.mod" "$dst/"; [ -f "$src/go.sum" ] && cp "$src/go.sum" "$dst/"
    return 0
  fi
  log "  (re)generating wrapper module tests/upstream/$name for: $stamp"
  ( cd "$dst"; go mod init "upstream.local/$name" 2>/dev/null; "$gen" )
  { printf '// %s\n// Generated by tests/upstream/build.sh; do not edit by hand.\n' "$stamp"; cat "$dst/go.mod"; } >"$dst/go.mod.new"
  mv "$dst/go.mod.new" "$dst/go.mod"
  cp "$dst/go.mod" "$dst/go.sum" "$src/"
  log "  wrote tests/upstream/$name/go.mod and go.sum (commit them)"
}

# after a build in $WORK/NAME: keep the committed go.mod/go.sum in step with what the build used
sync_wrapper() {
  local f
  for f in go.mod go.sum; do
    if ! cmp -s "$WORK/$1/$f" "$HERE/$1/$f"; then
      cp "$WORK/$1/$f" "$HERE/$1/$f"; log "  updated tests/upstream/$1/$f (commit it)"
    fi
  done
}

# begin KEY BINARY: returns 1 (skip) if $OUT/KEY/bin/BINARY exists, else prepares $OUT/KEY.tmp, returns 0
begin() {
  local key=$1 bin=$2
  if [ -x "$OUT/$key/bin/$bin" ]; then return 1; fi
  rm -rf "$OUT/$key.tmp"; mkdir -p "$OUT/$key.tmp/bin"
  return 0
}
finish() { rm -rf "$OUT/$1"; mv "$OUT/$1.tmp" "$OUT/$1"; }

link_bin() { mkdir -p "$OUT/bin"; ln -sfn "../$1/bin/$2" "$OUT/bin/$2"; }

# ---------------------------------------------------------------------------------------------
gen_etcd() {
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  copy_go_lines "$(modfile "go.etcd.io/etcd/server/v3@v$ETCD_VERSION")"
}
build_etcd() {
  local key=$KEY_etcd
  if begin "$key" etcd; then
    wrapper etcd "etcd v$ETCD_VERSION" gen_etcd
    ( cd "$WORK/etcd" && go build -p "$JOBS" -trimpath \
        -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" \
        -o "$OUT/$key.tmp/bin/etcd" go.etcd.io/etcd/server/v3 )
    sync_wrapper etcd
    finish "$key"
  fi
  link_bin "$key" etcd
}

KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
gen_kube() {
  local k=$KUBERNETES_VERSION up m n=0
  up=$(modfile "k8s.io/kubernetes@v$k")
  for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$up"); do
    go mod edit -replace="$m=$m@v0.${k#1.}"; n=$((n + 1))
  done
  [ "$n" -gt 20 ] || die "found only $n staging modules in $up"
  copy_go_lines "$up"
  local pkgs=() c
  for c in "${KUBE_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c@v$k"); done
  go get "${pkgs[@]}"
}
build_kube() {
  local key=$KEY_kube k=$KUBERNETES_VERSION c L p minor
  if begin "$key" kube-apiserver; then
    wrapper kube "k8s.io/kubernetes v$k" gen_kube
    minor=${k#1.}; minor=${minor%%.*}
    L="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      L="$L -X $p.gitVersion=v$k -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
      L="$L -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    ( cd "$WORK/kube" && go build -p "$JOBS" -trimpath -ldflags "$L" -o "$OUT/$key.tmp/bin/" \
        "${KUBE_CMDS[@]/#/k8s.io/kubernetes/cmd/}" )
    sync_wrapper kube
    finish "$key"
  fi
  for c in "${KUBE_CMDS[@]}"; do link_bin "$key" "$c"; done
}

capi_main() { # v1.14 moved main.go to core/ and the CRDs to core/config/crd/bases (older: repo root)
  if [ -f "$1/core/main.go" ]; then echo sigs.k8s.io/cluster-api/core; else echo sigs.k8s.io/cluster-api; fi
}
gen_capi() {
  go get "$(capi_main "$(moddir "sigs.k8s.io/cluster-api@v$CAPI_VERSION")")@v$CAPI_VERSION" \
    "sigs.k8s.io/cluster-api/api@v$CAPI_VERSION"
  copy_go_lines "$(modfile "sigs.k8s.io/cluster-api@v$CAPI_VERSION")"
}
build_capi() {
  local key=$KEY_capi dir main crds L p="sigs.k8s.io/cluster-api/version" minor
  if begin "$key" capi-manager; then
    wrapper capi "sigs.k8s.io/cluster-api v$CAPI_VERSION" gen_capi
    dir=$(moddir "sigs.k8s.io/cluster-api@v$CAPI_VERSION")
    main=$(capi_main "$dir")
    if [ -d "$dir/core/config/crd/bases" ]; then crds=$dir/core/config/crd/bases; else crds=$dir/config/crd/bases; fi
    minor=${CAPI_VERSION#*.}; minor=${minor%%.*}
    L="-s -w -X $p.gitVersion=v$CAPI_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    L="$L -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    ( cd "$WORK/capi" && go build -p "$JOBS" -trimpath -ldflags "$L" -o "$OUT/$key.tmp/bin/capi-manager" "$main" )
    sync_wrapper capi
    mkdir -p "$OUT/$key.tmp/crds"
    cp "$crds"/*.yaml "$OUT/$key.tmp/crds/"; chmod u+w "$OUT/$key.tmp/crds/"*.yaml
    finish "$key"
  fi
  link_bin "$key" capi-manager
  ln -sfn "$key/crds" "$OUT/capi-crds"
}

# shared_source NAME WHAT -> prints the extracted NAME/ tree under $WORK, after verifying
# ../shared/upstream/NAME.tar.xz (WHAT's source, which the module proxy does not serve) against
# its .sha256 file. Without that tarball, the same release is downloaded from its public
# repository and accepted only with the tree digest of tests/upstream/sources.lock
# (fetch_source). The tree is read-only input: builds write nothing into it (-mod=readonly,
# -o outside).
shared_source() {
  local name=$1 what=$2 tarball sum want got dir
  tarball=$SHARED_UPSTREAM/$name.tar.xz
  sum=$tarball.sha256
  dir=$WORK/$name
  if [ ! -f "$tarball" ]; then
    want=$(pinned_tarball_sha "$name")
    if [ ! -f "$dir/.complete" ] || [ "$(cat "$dir/.complete")" != "$want" ]; then
      fetch_source "$name" "$what" "$dir" >&2
      echo "$want" >"$dir/.complete"
    fi
    printf '%s\n' "$dir"
    return 0
  fi
  [ -f "$sum" ] || die "missing $sum (the checksum of $tarball)"
  want=$(cut -d' ' -f1 "$sum")
  if [ ! -f "$dir/.complete" ] || [ "$(cat "$dir/.complete")" != "$want" ]; then
    got=$(sha256sum "$tarball" | cut -d' ' -f1)
    [ "$got" = "$want" ] || die "checksum mismatch for $tarball: got $got, want $want"
    rm -rf "$dir"
    tar -xJf "$tarball" -C "$WORK"
    [ -f "$dir/go.mod" ] || die "$tarball did not unpack to $name/"
    echo "$want" >"$dir/.complete"
  fi
  printf '%s\n' "$dir"
}

# lock_field NAME COLUMN -> column 2 (the shared tarball's sha256) or 3 (the tree digest) of
# NAME's line in tests/upstream/sources.lock.
lock_field() {
  local v
  v=$(awk -v n="$1" -v c="$2" '$1 == n { print $c }' "$HERE/sources.lock")
  [ -n "$v" ] || die "tests/upstream/sources.lock has no line for $1"
  printf '%s\n' "$v"
}

# pinned_tarball_sha NAME -> the sha256 of ../shared/upstream/NAME.tar.xz: its .sha256 file, or
# the lock's when the tarball is not there (the cache keys stay the same either way).
pinned_tarball_sha() {
  local f=$SHARED_UPSTREAM/$1.tar.xz.sha256
  if [ -f "$f" ]; then cut -d' ' -f1 "$f"; else lock_field "$1" 2; fi
}

# tree_digest DIR -> the digest tests/upstream/sources.lock pins (see there).
tree_digest() {
  ( cd "$1" \
      && find . -type f ! -path ./.complete -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum \
      && find . -type l -print0 | LC_ALL=C sort -z \
        | while IFS= read -r -d '' f; do printf 'symlink %s -> %s\n' "$f" "$(readlink "$f")"; done
  ) | sha256sum | cut -d' ' -f1
}

# fetch_source NAME WHAT DIR: downloads NAME's release from its public repository
# ($NGO_UPSTREAM_ARCHIVES, default https://codeload.github.com: cluster-autoscaler-<v> is the
# cluster-autoscaler/ directory of kubernetes/autoscaler at tag cluster-autoscaler-<v>,
# cherrygo-<v> is cherryservers/cherrygo at tag v<v>), keeps the tree ../shared/upstream would
# hold, and accepts it only with the lock's tree digest.
fetch_source() {
  local name=$1 what=$2 dir=$3 base=${NGO_UPSTREAM_ARCHIVES:-https://codeload.github.com}
  local path subdir want got scratch top
  case $name in
    cluster-autoscaler-*) path=kubernetes/autoscaler/tar.gz/refs/tags/$name subdir=cluster-autoscaler ;;
    cherrygo-*) path=cherryservers/cherrygo/tar.gz/refs/tags/v${name#cherrygo-} subdir=. ;;
    *) die "no public repository known for $name" ;;
  esac
  want=$(lock_field "$name" 3)
  command -v curl >/dev/null || die "$SHARED_UPSTREAM/$name.tar.xz is missing and curl is not installed to fetch $what's source"
  echo "--- $SHARED_UPSTREAM/$name.tar.xz is missing: fetching $what's source from $base/$path"
  scratch=$(mktemp -d "$WORK/.fetch-$name.XXXXXX")
  curl -fsSL --retry 3 "$base/$path" -o "$scratch/archive.tar.gz" \
    || { rm -rf "$scratch"; die "cannot download $base/$path ($what's source; or put $name.tar.xz and its .sha256 in $SHARED_UPSTREAM)"; }
  mkdir "$scratch/tree"
  tar -xzf "$scratch/archive.tar.gz" -C "$scratch/tree" || { rm -rf "$scratch"; die "$base/$path is not a tar.gz archive"; }
  top=$(find "$scratch/tree" -mindepth 1 -maxdepth 1 -type d | head -n 1)
  [ -n "$top" ] && [ -d "$top/$subdir" ] || { rm -rf "$scratch"; die "$base/$path has no $subdir/ directory"; }
  rm -rf "$dir"
  mv "$top/$subdir" "$dir"
  rm -rf "$scratch"
  # What ../shared/upstream leaves out: never used by a build here.
  rm -rf "$dir/vendor" "$dir/cloudprovider/aws/aws-sdk-go"
  got=$(tree_digest "$dir")
  if [ "$got" != "$want" ]; then
    rm -rf "$dir"
    die "the source of $name from $base/$path is not the pinned tree (digest $got, tests/upstream/sources.lock pins $want)"
  fi
  [ -f "$dir/go.mod" ] || die "$name from $base/$path has no go.mod"
}

# ca_source VERSION -> prints the extracted cluster-autoscaler-VERSION/ tree under $WORK.
ca_source() {
  shared_source "cluster-autoscaler-$1" cluster-autoscaler
}

# CA's source tree alone: tests render its charts/cluster-autoscaler with the real helm. The
# binary build extracts it too, but a cached binary does not bring the tree back.
build_ca_source() {
  ca_source "$CA_VERSION" >/dev/null
}

# The CRDs of the objects the chart renders for other projects' controllers (ServiceMonitor,
# PrometheusRule, cert-manager Certificate/Issuer/ClusterIssuer), copied from those projects'
# Go modules; nothing is built.
build_ecosystem_crds() {
  local key=$KEY_ecosystem dir
  if [ ! -f "$OUT/$key/.complete" ]; then
    rm -rf "$OUT/$key.tmp"; mkdir -p "$OUT/$key.tmp"
    dir=$(moddir "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION")
    cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml "$OUT/$key.tmp/"
    dir=$(moddir "github.com/cert-manager/cert-manager@v$CERT_MANAGER_VERSION")
    cp "$dir"/deploy/crds/cert-manager.io_{certificates,issuers,clusterissuers}.yaml "$OUT/$key.tmp/"
    chmod u+w "$OUT/$key.tmp/"*.yaml
    touch "$OUT/$key.tmp/.complete"
    finish "$key"
  fi
  ln -sfn "$key" "$OUT/ecosystem-crds"
}

# cluster-autoscaler with the externalgrpc (ours) and clusterapi (in-tree, for side-by-side
# comparisons) providers. Always pass --cloud-provider: with two tags the default is ambiguous.
build_ca() {
  local key=$KEY_ca t
  if begin "$key" cluster-autoscaler; then
    t=$(ca_source "$CA_VERSION")
    ( cd "$t" && GOFLAGS="-mod=readonly -buildvcs=false" go build -p "$JOBS" -trimpath \
        -tags externalgrpc,clusterapi -ldflags "-s -w" -o "$OUT/$key.tmp/bin/cluster-autoscaler" . )
    finish "$key"
  fi
  link_bin "$key" cluster-autoscaler
}

# cluster-autoscaler-<version>: the real binary of CA release <version> (one of
# CA_BINARY_ALL_VERSIONS), bin/cluster-autoscaler-<version>, for the end-to-end tests and
# `make compat` against older releases. Built like build_ca: from that release's checksum-verified
# tarball, in its own tree, with its own go.mod and go.sum (-mod=readonly; no release vendors its
# dependencies), -trimpath -ldflags "-s -w". The CA_VERSION release is build_ca itself (same
# key, bin/cluster-autoscaler, which the sandbox runs for it).
# A dependency the module proxy refuses (CONFORMANCE_SUBSTITUTE_<version>, versions.env: only
# k8s.io/kubernetes v1.32.12 of CA 1.32.7) is replaced by the same substitute as in that release's
# conformance client: the build reads a scratch copy of CA's go.mod with the replace line added
# and CA's go.sum plus the substitute's two lines from the committed
# tests/upstream/conformance/ca-<version>/go.sum (-modfile; the tree itself stays untouched).

# ca_binary_tags VERSION -> the providers compiled in. Up to 1.35, cloudprovider/builder has one
# builder_<provider>.go per build tag, each defining AvailableCloudProviders, DefaultCloudProvider
# and buildCloudProvider, so a build takes one provider tag (two do not compile): externalgrpc.
# From 1.36 providers register themselves (cloudprovider/router) and combine: clusterapi too, as
# in build_ca (the in-tree provider the migration test compares with).
ca_binary_tags() {
  case $1 in
    1.29.*|1.3[0-5].*) echo externalgrpc ;;
    *) echo externalgrpc,clusterapi ;;
  esac
}

# ca_binary_key VERSION -> cluster-autoscaler-<version>-<hash of the tarball's checksum, the tags
# and the substitutes>; KEY_ca for CA_VERSION.
ca_binary_key() {
  local v=$1 sum
  if [ "$v" = "$CA_VERSION" ]; then echo "$KEY_ca"; return 0; fi
  sum=$(pinned_tarball_sha "cluster-autoscaler-$v")
  printf 'cluster-autoscaler-%s-%s\n' "$v" \
    "$( { echo "$sum"; ca_binary_tags "$v"; conformance_substitutes "$v"; } | sha256sum | cut -c1-12)"
}

# cluster-autoscaler-clusterapi-<version>: the same release built with the in-tree clusterapi
# provider alone (-tags clusterapi), bin/cluster-autoscaler-clusterapi-<version>, for releases
# whose binary above has externalgrpc alone (before 1.36): the benchmark compares CA 1.34.5's
# in-tree provider with ours through its externalgrpc binary.
ca_clusterapi_binary_key() {
  printf 'cluster-autoscaler-clusterapi-%s-%s\n' "$1" \
    "$( { pinned_tarball_sha "cluster-autoscaler-$1"; echo clusterapi; conformance_substitutes "$1"; } | sha256sum | cut -c1-12)"
}

# cluster-autoscaler-<version>-<patch>: the same release with one patch of docs/upstream.md,
# tests/upstream/patches/cluster-autoscaler-<version>/<patch>.patch, applied alone,
# bin/cluster-autoscaler-<version>-<patch>: the benchmark measures what each patch would give
# (make bench); the product never ships or needs a patched CA. Built as the release's binary
# above (the same tags, flags and go.sum; for CA_VERSION as build_ca) from a scratch copy of the
# extracted tree with the patch applied (ca_patched_source); the key hashes the patch too, so a
# changed patch is a new build. `cluster-autoscaler-patched` stands for every patch kept there.
ca_patched_binary_key() {
  local p
  p=$(ca_patch_file "$1" "$2") || exit 1   # (a command substitution runs without set -e)
  printf 'cluster-autoscaler-%s-%s-%s\n' "$1" "$2" \
    "$( { pinned_tarball_sha "cluster-autoscaler-$1"; ca_binary_tags "$1"; conformance_substitutes "$1"; \
          sha256sum <"$p"; } | sha256sum | cut -c1-12)"
}

# ca_patch_file VERSION PATCH -> tests/upstream/patches/cluster-autoscaler-VERSION/PATCH.patch
ca_patch_file() {
  local p=$HERE/patches/cluster-autoscaler-$1/$2.patch
  [ -f "$p" ] || die "no patch $2 for cluster-autoscaler $1: ${p#"$ROOT"/} is missing"
  printf '%s\n' "$p"
}

# ca_patches -> "<version>-<patch>" of every patch under tests/upstream/patches/
ca_patches() {
  local f d
  for f in "$HERE"/patches/cluster-autoscaler-*/*.patch; do
    [ -f "$f" ] || continue
    d=${f%/*}
    printf '%s-%s\n' "${d##*/cluster-autoscaler-}" "$(basename "$f" .patch)"
  done
}

# ca_patched_source VERSION PATCH TREE -> prints $WORK/cluster-autoscaler-VERSION-PATCH, a fresh
# copy of TREE (CA VERSION's extracted source, which stays untouched) with PATCH applied exactly
# (no fuzz: a hunk whose context changed fails rather than lands elsewhere).
ca_patched_source() {
  local v=$1 name=$2 t=$3 p dst=$WORK/cluster-autoscaler-$1-$2 out
  p=$(ca_patch_file "$v" "$name") || exit 1
  command -v patch >/dev/null || die "patch is not installed (it applies ${p#"$ROOT"/})"
  rm -rf "$dst"
  cp -a "$t" "$dst" || die "cannot copy $t to $dst"
  rm -f "$dst/.complete"
  out=$(patch -d "$dst" -p1 --forward --batch --fuzz=0 --no-backup-if-mismatch -i "$p" 2>&1) || {
    log "$out"; rm -rf "$dst"
    die "${p#"$ROOT"/} no longer applies to cluster-autoscaler $v's source: update the patch (docs/upstream.md)"
  }
  printf '%s\n' "$dst"
}

build_ca_binary() {
  local v=$1 key bin=cluster-autoscaler-$1 t tags d m mv sums modfile=() patch=
  case ${2:-} in
    clusterapi) key=$(ca_clusterapi_binary_key "$v") bin=cluster-autoscaler-clusterapi-$v tags=clusterapi ;;
    patch) patch=$3 key=$(ca_patched_binary_key "$v" "$3") bin=cluster-autoscaler-$v-$3 tags=$(ca_binary_tags "$v") ;;
    *)
      if [ "$v" = "$CA_VERSION" ]; then build_ca; return 0; fi
      key=$(ca_binary_key "$v")
      tags=$(ca_binary_tags "$v") ;;
  esac
  if begin "$key" "$bin"; then
    t=$(ca_source "$v")
    # a const up to 1.35, a var (overridable by -ldflags) from 1.36
    grep -Eq "^(const|var) ClusterAutoscalerVersion = \"$v\"\$" "$t/version/version.go" \
      || die "$t/version/version.go does not say $v"
    [ -z "$patch" ] || t=$(ca_patched_source "$v" "$patch" "$t")
    if [ -n "$(conformance_substitutes "$v")" ]; then
      d=$WORK/cluster-autoscaler-$v-modfile
      rm -rf "$d"; mkdir -p "$d"
      cp "$t/go.mod" "$t/go.sum" "$d/"; chmod u+w "$d/go.mod" "$d/go.sum"
      while read -r m mv; do
        go mod edit -replace="$m=$m@$mv" "$d/go.mod"
        sums=$(grep -F -e "$m $mv h1:" -e "$m $mv/go.mod h1:" "$HERE/conformance/ca-$v/go.sum") || true
        [ "$(grep -c . <<<"$sums")" -eq 2 ] \
          || die "tests/upstream/conformance/ca-$v/go.sum has no hashes of $m $mv (the pin of CONFORMANCE_SUBSTITUTE_${v//./_}): build conformance-$v first"
        printf '%s\n' "$sums" >>"$d/go.sum"
      done < <(conformance_substitutes "$v")
      modfile=(-modfile="$d/go.mod")
    fi
    ( cd "$t" && GOFLAGS="-mod=readonly -buildvcs=false" go build "${modfile[@]}" -p "$JOBS" -trimpath \
        -tags "$tags" -ldflags "-s -w" -o "$OUT/$key.tmp/bin/$bin" . ) \
      || die "building cluster-autoscaler $v${patch:+ with $patch.patch} (-tags $tags) failed"
    finish "$key"
  fi
  link_bin "$key" "$bin"
}

# The upstream example externalgrpc server wrapping the in-tree clusterapi provider: the
# benchmarks' upstream peer. Built from CA $EXAMPLE_CA_VERSION because the 1.36.1 example
# panics at start with clusterapi (it never sets the Processors option BuildClusterAPI reads).
build_example() {
  local key=$KEY_example t
  if begin "$key" externalgrpc-example-server; then
    t=$(ca_source "$EXAMPLE_CA_VERSION")
    ( cd "$t" && GOFLAGS="-mod=readonly -buildvcs=false" go build -p "$JOBS" -trimpath \
        -tags clusterapi -ldflags "-s -w" -o "$OUT/$key.tmp/bin/externalgrpc-example-server" \
        ./cloudprovider/externalgrpc/examples/external-grpc-cloud-provider-service )
    finish "$key"
  fi
  link_bin "$key" externalgrpc-example-server
}

# go install MODULE/PKG@VERSION works for kwok and helm (no replace directives); the module's own
# go.sum pins everything. -mod=mod is not allowed with pkg@version.
build_kwok() {
  local key=$KEY_kwok dir f
  if begin "$key" kwok; then
    GOFLAGS=-buildvcs=false GOBIN="$OUT/$key.tmp/bin" go install -p "$JOBS" -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
      "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
    dir=$(moddir "sigs.k8s.io/kwok@v$KWOK_VERSION")
    mkdir -p "$OUT/$key.tmp/stages"
    for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
             node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
      cp "$dir/kustomize/stage/$f.yaml" "$OUT/$key.tmp/stages/"
    done
    # the set kwokctl injects when node leases are on (see NOTES.md)
    for f in node-initialize node-heartbeat-with-lease pod-ready pod-complete pod-delete; do
      printf -- '---\n'; cat "$OUT/$key.tmp/stages/$f.yaml"
    done >"$OUT/$key.tmp/stages/default.yaml"
    chmod u+w "$OUT/$key.tmp/stages/"*.yaml
    finish "$key"
  fi
  link_bin "$key" kwok
  ln -sfn "$key/stages" "$OUT/kwok-stages"
}

build_helm() {
  local key=$KEY_helm
  if begin "$key" helm; then
    GOFLAGS=-buildvcs=false GOBIN="$OUT/$key.tmp/bin" go install -p "$JOBS" -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
      "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
    finish "$key"
  fi
  link_bin "$key" helm
}

# nodegroup-conformance-<version>: our own Go program in tests/upstream/conformance that runs CA
# <version>'s own externalgrpc client, i.e. imports
# k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc from that release's source.
# main.go and views.go are common; provider_<tag>.go builds the provider the way that generation
# of CA does (conformance_tag maps versions to tags). Each version has its own committed module
# files, tests/upstream/conformance/ca-<version>/go.mod and go.sum: the proxy does not serve CA, so
# go.mod replaces it with the extracted source tree, which the scratch copy
# $WORK/conformance-<version> sits next to, and copies CA's other replace lines (a dependency's
# replace lines do not apply). The scratch copy holds the common files, the version's provider
# file and its go.mod/go.sum; it is built with -mod=readonly and -tags <tag>,externalgrpc (CA's
# builder with only that provider, as CA's own externalgrpc builds): the committed go.sum
# is the pin, and an untidy go.mod is an error here rather than a silent change. Checked before
# building: grpc-go is the version CA's go.mod requires, and every module linked into the binary
# has the version CA's own build list selects (k8s.io/api, apimachinery, grpc, protobuf, ...), so
# the client is CA's down to its dependencies. A missing ca-<version>/go.mod is generated (go mod
# tidy next to the extracted tree) and copied back for committing.

# conformance_tags VERSION -> the build tags: the generation's, and externalgrpc (as CA's own
# externalgrpc builds: cloudprovider/builder with only that provider)
conformance_tags() {
  printf '%s,externalgrpc\n' "$(conformance_tag "$1")"
}

# conformance_tag VERSION -> the build tag of the provider_<tag>.go file for that CA release
conformance_tag() {
  case $1 in
    1.29.*|1.30.*|1.31.*|1.32.*) echo ca129 ;;  # no config/flags; BuildExternalGrpc(config.AutoscalingOptions)
    1.33.*|1.34.*) echo ca133 ;;                # config/flags; BuildExternalGrpc(config.AutoscalingOptions)
    1.3[5-9].*) echo ca135 ;;                   # BuildExternalGrpc(*core/options.AutoscalerOptions)
    *) die "no nodegroup-conformance generation for CA $1 (conformance_tag in build.sh knows 1.29 to 1.39)" ;;
  esac
}

# conformance_substitutes VERSION -> "module version" lines: the modules CA VERSION's go.mod
# requires at a version the proxy does not serve, and the version used instead
# (CONFORMANCE_SUBSTITUTE_<version with _> in versions.env, comma-separated module@version)
conformance_substitutes() {
  local var=CONFORMANCE_SUBSTITUTE_${1//./_} item
  [ -n "${!var:-}" ] || return 0
  IFS=, read -r -a items <<<"${!var}"
  for item in "${items[@]}"; do printf '%s %s\n' "${item%@*}" "${item#*@}"; done
}

# gen_conformance_mod VERSION TREE: write go.mod and go.sum in the current (scratch) directory for
# CA VERSION's extracted TREE (a sibling directory), then copy them to conformance/ca-VERSION/.
gen_conformance_mod() {
  local v=$1 t=$2 name=${2##*/} tidy errors
  log "  generating tests/upstream/conformance/ca-$v/go.mod and go.sum (go mod tidy against $name)"
  grep -q '^replace[[:space:]]*($' "$t/go.mod" && die "$t/go.mod has a replace block; gen_conformance_mod copies single replace lines only"
  {
    printf '// nodegroup-conformance against cluster-autoscaler %s. Generated by tests/upstream/build.sh\n' "$v"
    printf '// (gen_conformance_mod); to regenerate, delete this file and go.sum and run build.sh.\n'
    printf '// The module proxy does not serve CA: build.sh extracts its source tarball to\n'
    printf '// target/upstream/work/%s, next to the scratch copy of this module\n' "$name"
    printf '// (work/conformance-%s), hence the directory replacements. Every\n' "$v"
    printf "// other replace line is copied from CA's go.mod (replacements of dependencies apply only in\n"
    printf '// the main module; relative ones now point into that tree), so the build selects the\n'
    printf '// versions CA itself builds with.\n'
    printf 'module upstream.local/conformance\n'
  } >go.mod
  copy_go_lines "$t/go.mod"
  go mod edit -require=k8s.io/autoscaler/cluster-autoscaler@v0.0.0-00010101000000-000000000000 \
    -replace="k8s.io/autoscaler/cluster-autoscaler=../$name"
  printf '\n// Copied from %s/go.mod:\n' "$name" >>go.mod
  grep '^replace[[:space:]]' "$t/go.mod" | sed "s#=> \./#=> ../$name/#" >>go.mod
  conformance_substitutes "$v" | while read -r m mv; do
    printf '\n// %s: CA requires a version the module proxy does not serve (versions.env\n' "$m" >>go.mod
    printf '// CONFORMANCE_SUBSTITUTE_%s); this one is used instead.\n' "${v//./_}" >>go.mod
    printf 'replace %s => %s %s\n' "$m" "$m" "$mv" >>go.mod
  done
  # Seeded with CA's own go.sum (tidy keeps what the module needs), so modules CA already pins
  # need no checksum-database lookup (some answer 404 there). The tarballs leave out
  # cloudprovider/aws/aws-sdk-go/, which CA's cloudprovider/builder imports from 1.33 to 1.35
  # without build tags (config/flags imports the builder); tidy reads every build tag, the
  # build (-tags externalgrpc) never imports it: those errors, and only those, are expected.
  cp "$t/go.sum" go.sum
  tidy=$(GOFLAGS="-mod=mod -buildvcs=false" go mod tidy -e 2>&1) || true
  errors=$(grep -E $'^\t[^ ]+: ' <<<"$tidy" | grep -v $'^\tk8s\\.io/autoscaler/cluster-autoscaler/cloudprovider/aws/aws-sdk-go/') || true
  [ -z "$errors" ] || { log "$tidy"; die "go mod tidy for CA $v failed"; }
  mkdir -p "$HERE/conformance/ca-$v"
  cp go.mod go.sum "$HERE/conformance/ca-$v/"
  log "  wrote tests/upstream/conformance/ca-$v/go.mod and go.sum (commit them)"
}

# conformance_scratch VERSION: a fresh scratch copy $WORK/conformance-VERSION of the common
# sources and VERSION's provider_<tag>.go (only those: go mod tidy reads every file whatever its
# build tags, and the other generations import CA packages this release lacks)
conformance_scratch() {
  local src=$HERE/conformance dst=$WORK/conformance-$1 tag f
  tag=$(conformance_tag "$1")
  [ -f "$src/provider_$tag.go" ] || die "tests/upstream/conformance/provider_$tag.go missing (CA $1)"
  rm -rf "$dst"; mkdir -p "$dst"
  for f in "$src"/*.go; do
    case ${f##*/} in provider_*.go) ;; *) cp "$f" "$dst/" ;; esac
  done
  cp "$src/provider_$tag.go" "$dst/"
}

# ensure_conformance_mod VERSION: generate tests/upstream/conformance/ca-VERSION/go.mod and go.sum
# when they are missing (before the cache key, which hashes them, is computed)
ensure_conformance_mod() {
  local v=$1 mod=$HERE/conformance/ca-$1 t
  [ -f "$mod/go.mod" ] && [ -f "$mod/go.sum" ] && return 0
  t=$(ca_source "$v")
  conformance_scratch "$v"
  ( cd "$WORK/conformance-$v" && gen_conformance_mod "$v" "$t" )
}

build_conformance() {
  local v=$1 key bin=nodegroup-conformance-$1 mod=$HERE/conformance/ca-$1
  local dst=$WORK/conformance-$1 t want got bad
  local fmt='{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}'
  key=$(conformance_key "$v")
  if begin "$key" "$bin"; then
    [ -f "$mod/go.mod" ] && [ -f "$mod/go.sum" ] || die "tests/upstream/conformance/ca-$v/go.mod or go.sum missing"
    t=$(ca_source "$v")
    conformance_scratch "$v"
    cp "$mod/go.mod" "$mod/go.sum" "$dst/"
    grep -q "^replace k8s.io/autoscaler/cluster-autoscaler => \.\./${t##*/}\$" "$dst/go.mod" \
      || die "tests/upstream/conformance/ca-$v/go.mod must replace k8s.io/autoscaler/cluster-autoscaler => ../${t##*/}"
    export GOFLAGS="-mod=readonly -buildvcs=false -tags=$(conformance_tags "$v")"
    want=$(sed -nE 's#^(require[[:space:]]+)?[[:space:]]*google\.golang\.org/grpc[[:space:]]+(v[^[:space:]]+).*#\2#p' "$t/go.mod" | head -1)
    [ -n "$want" ] || die "CA $v's go.mod requires no google.golang.org/grpc"
    got=$(cd "$dst" && go list -m -f "$fmt" google.golang.org/grpc) \
      || die "tests/upstream/conformance/ca-$v/go.mod is not tidy: delete it and go.sum to regenerate them, or tidy in $dst (see NOTES.md)"
    [ "$got" = "google.golang.org/grpc $want" ] \
      || die "tests/upstream/conformance/ca-$v/go.mod selects '$got', CA $v's go.mod requires $want"
    # "path version" of every module providing a linked package, and of CA's build list
    ( cd "$dst" && go list -deps -f "{{with .Module}}$fmt{{end}}" . ) | LC_ALL=C sort -u >"$dst/linked.txt" \
      || die "listing the modules nodegroup-conformance-$v links failed"
    # CA's build list; with substitutes, of CA's go.mod plus the same replace lines (a scratch
    # copy, -mod=mod: CA's go.sum lacks the substitutes)
    cp "$t/go.mod" "$dst/ca-go.mod"; cp "$t/go.sum" "$dst/ca-go.sum"
    while read -r m mv; do
      grep -q "^replace $m => $m $mv\$" "$dst/go.mod" \
        || die "tests/upstream/conformance/ca-$v/go.mod must replace $m => $m $mv (versions.env CONFORMANCE_SUBSTITUTE_${v//./_})"
      go mod edit -replace="$m=$m@$mv" "$dst/ca-go.mod"
    done < <(conformance_substitutes "$v")
    ( cd "$t" && GOFLAGS="-mod=mod -buildvcs=false" go list -modfile="$dst/ca-go.mod" -m -f "$fmt" all ) \
      | LC_ALL=C sort -u >"$dst/ca-build-list.txt" \
      || die "listing CA $v's build list failed"
    bad=$(LC_ALL=C comm -23 "$dst/linked.txt" "$dst/ca-build-list.txt" | grep -v '^upstream\.local/' | paste -sd' ') || true
    [ -z "$bad" ] || die "nodegroup-conformance-$v links modules at versions CA $v does not select: $bad"
    ( cd "$dst" && go build -p "$JOBS" -trimpath -ldflags "-s -w -X main.caVersion=$v" \
        -o "$OUT/$key.tmp/bin/$bin" . ) \
      || die "building nodegroup-conformance-$v failed (go.sum incomplete? tidy tests/upstream/conformance/ca-$v, see NOTES.md)"
    [ "$("$OUT/$key.tmp/bin/$bin" --version)" = "$v" ] || die "$bin --version does not say $v"
    finish "$key"
  fi
  link_bin "$key" "$bin"
  # the unsuffixed name is the pinned release's client (CaClient::start)
  [ "$v" != "$CA_VERSION" ] || ln -sfn "../$key/bin/$bin" "$OUT/bin/nodegroup-conformance"
}

layout() {
  echo "upstream layout ($OUT):"
  local f
  for f in "$OUT"/bin/* "$OUT/capi-crds" "$OUT/kwok-stages" "$OUT/ecosystem-crds"; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    if [ -e "$f" ]; then printf '  %-40s -> %s\n' "${f#"$ROOT"/}" "$(readlink "$f")"
    else printf '  %-40s -> %s (MISSING)\n' "${f#"$ROOT"/}" "$(readlink "$f")"; fi
  done
}

# cherry-check: our own Go module in tests/upstream/cherry-check (go.mod and go.sum committed) that
# drives the Cherry Servers emulator with the official clients (tests/clouds/cherry_api.rs runs both):
#   bin/cherry-check         main.go, with cherrygo $CHERRYGO_VERSION, Cherry Servers' Go client;
#   bin/cherry-check-intree  intree/emulator_check_test.go compiled (go test -c) as a test of CA's
#                            in-tree cloudprovider/cherryservers package, whose non-test files are
#                            copied unmodified from the extracted CA tree next to it.
# The proxy serves neither cherrygo nor CA: their sources come from ../shared/upstream (checksums
# verified, extracted under $WORK, never modified), named by go.mod's replace lines relative to the
# scratch copy $WORK/cherry-check. Built with -mod=readonly: the committed go.sum is the pin.
cherry_check_hash() {
  ( cd "$HERE/cherry-check" 2>/dev/null && find . -maxdepth 2 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) \
      | LC_ALL=C sort | xargs -r sha256sum | sha256sum | cut -c1-12 )
}
KEY_cherry_check=cherry-check-$CHERRYGO_VERSION-$CA_VERSION-$(cherry_check_hash)
# cherrygo_source -> prints the extracted cherrygo-$CHERRYGO_VERSION/ tree under $WORK
cherrygo_source() {
  shared_source "cherrygo-$CHERRYGO_VERSION" cherrygo
}
build_cherry_check() {
  local key=$KEY_cherry_check src=$HERE/cherry-check dst=$WORK/cherry-check g t f
  if begin "$key" cherry-check-intree; then
    [ -f "$src/go.mod" ] && [ -f "$src/go.sum" ] || die "tests/upstream/cherry-check/go.mod or go.sum missing"
    g=$(cherrygo_source)
    t=$(ca_source "$CA_VERSION")
    grep -q "^replace github.com/cherryservers/cherrygo/v4 => \.\./${g##*/}\$" "$src/go.mod" \
      || die "tests/upstream/cherry-check/go.mod must replace github.com/cherryservers/cherrygo/v4 => ../${g##*/} (CHERRYGO_VERSION=$CHERRYGO_VERSION)"
    grep -q "^replace k8s.io/autoscaler/cluster-autoscaler => \.\./${t##*/}\$" "$src/go.mod" \
      || die "tests/upstream/cherry-check/go.mod must replace k8s.io/autoscaler/cluster-autoscaler => ../${t##*/} (CA_VERSION=$CA_VERSION)"
    rm -rf "$dst"; mkdir -p "$dst/intree"
    cp "$src"/*.go "$src/go.mod" "$src/go.sum" "$dst/"
    cp "$src"/intree/*.go "$dst/intree/"
    for f in "$t"/cloudprovider/cherryservers/*.go; do
      case $f in *_test.go) ;; *) cp "$f" "$dst/intree/" ;; esac
    done
    ( cd "$dst" && GOFLAGS="-mod=readonly -buildvcs=false" go build -p "$JOBS" -trimpath -ldflags "-s -w" \
        -o "$OUT/$key.tmp/bin/cherry-check" . \
      && GOFLAGS="-mod=readonly -buildvcs=false" go test -c -p "$JOBS" -trimpath -ldflags "-s -w" \
        -o "$OUT/$key.tmp/bin/cherry-check-intree" ./intree ) \
      || die "building cherry-check failed (go.sum incomplete? run go mod tidy in $dst and copy go.mod and go.sum back)"
    finish "$key"
  fi
  link_bin "$key" cherry-check
  link_bin "$key" cherry-check-intree
}

# alicloud-check: our own Go module in tests/upstream/alicloud-check (go.mod and go.sum committed)
# that drives the Alibaba Cloud ESS/ECS emulator with cluster-autoscaler's in-tree alicloud
# provider and the SDK it vendors (tests/clouds/alicloud_api.rs runs it):
#   bin/alicloud-check-intree  intree/emulator_check_test.go compiled (go test -c) as a test of CA's
#                              in-tree cloudprovider/alicloud package, whose non-test files are
#                              copied unmodified from the extracted CA tree next to it.
# CA's source comes from ../shared/upstream (checksum verified, extracted under $WORK, never
# modified), named by go.mod's replace line relative to the scratch copy $WORK/alicloud-check.
# Built with -mod=readonly: the committed go.sum is the pin.
alicloud_check_hash() {
  ( cd "$HERE/alicloud-check" 2>/dev/null && find . -maxdepth 2 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) \
      | LC_ALL=C sort | xargs -r sha256sum | sha256sum | cut -c1-12 )
}
KEY_alicloud_check=alicloud-check-$CA_VERSION-$(alicloud_check_hash)
build_alicloud_check() {
  local key=$KEY_alicloud_check src=$HERE/alicloud-check dst=$WORK/alicloud-check t f
  if begin "$key" alicloud-check-intree; then
    [ -f "$src/go.mod" ] && [ -f "$src/go.sum" ] || die "tests/upstream/alicloud-check/go.mod or go.sum missing"
    t=$(ca_source "$CA_VERSION")
    grep -q "^replace k8s.io/autoscaler/cluster-autoscaler => \.\./${t##*/}\$" "$src/go.mod" \
      || die "tests/upstream/alicloud-check/go.mod must replace k8s.io/autoscaler/cluster-autoscaler => ../${t##*/} (CA_VERSION=$CA_VERSION)"
    rm -rf "$dst"; mkdir -p "$dst/intree"
    cp "$src/go.mod" "$src/go.sum" "$dst/"
    cp "$src"/intree/*.go "$dst/intree/"
    for f in "$t"/cloudprovider/alicloud/*.go; do
      case $f in *_test.go) ;; *) cp "$f" "$dst/intree/" ;; esac
    done
    ( cd "$dst" && GOFLAGS="-mod=readonly -buildvcs=false" go test -c -p "$JOBS" -trimpath -ldflags "-s -w" \
        -o "$OUT/$key.tmp/bin/alicloud-check-intree" ./intree ) \
      || die "building alicloud-check failed (go.sum incomplete? run go mod tidy in $dst and copy go.mod and go.sum back)"
    finish "$key"
  fi
  link_bin "$key" alicloud-check-intree
}

# clusterapi-diff: our own Go module in tests/upstream/clusterapi-diff (go.mod and go.sum committed)
# that asks CA's in-tree cloudprovider/clusterapi provider and CA's externalgrpc client (talking to
# the operator) the same questions over the same Cluster API objects (tests/operator/intree_diff.rs
# runs it): bin/clusterapi-diff. Both providers are CA_VERSION's packages, unmodified, registered
# as cloudprovider/router registers them and built by cloudprovider/builder.NewCloudProvider from
# CA's own flags. CA's source comes from ../shared/upstream (checksum verified, extracted under
# $WORK, never modified), named by go.mod's replace line relative to the scratch copy
# $WORK/clusterapi-diff. Built with -mod=readonly: the committed go.sum is the pin.
clusterapi_diff_hash() {
  ( cd "$HERE/clusterapi-diff" 2>/dev/null && find . -maxdepth 1 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) \
      | LC_ALL=C sort | xargs -r sha256sum | sha256sum | cut -c1-12 )
}
KEY_clusterapi_diff=clusterapi-diff-$CA_VERSION-$(clusterapi_diff_hash)
build_clusterapi_diff() {
  local key=$KEY_clusterapi_diff src=$HERE/clusterapi-diff dst=$WORK/clusterapi-diff t
  if begin "$key" clusterapi-diff; then
    [ -f "$src/go.mod" ] && [ -f "$src/go.sum" ] || die "tests/upstream/clusterapi-diff/go.mod or go.sum missing"
    t=$(ca_source "$CA_VERSION")
    grep -q "^replace k8s.io/autoscaler/cluster-autoscaler => \.\./${t##*/}\$" "$src/go.mod" \
      || die "tests/upstream/clusterapi-diff/go.mod must replace k8s.io/autoscaler/cluster-autoscaler => ../${t##*/} (CA_VERSION=$CA_VERSION)"
    rm -rf "$dst"; mkdir -p "$dst"
    cp "$src"/*.go "$src/go.mod" "$src/go.sum" "$dst/"
    ( cd "$dst" && GOFLAGS="-mod=readonly -buildvcs=false" go build -p "$JOBS" -trimpath -ldflags "-s -w" \
        -o "$OUT/$key.tmp/bin/clusterapi-diff" . ) \
      || die "building clusterapi-diff failed (go.sum incomplete? run go mod tidy in $dst and copy go.mod and go.sum back)"
    finish "$key"
  fi
  link_bin "$key" clusterapi-diff
}

# ---------------------------------------------------------------------------------------------
[ "${1:-}" = --layout ] && { layout; exit 0; }
comps=("$@"); [ ${#comps[@]} -eq 0 ] || [ "${comps[0]}" = all ] && comps=("${ALL[@]}")
# conformance and conformance-all stand for one conformance-<version> component per version
expanded=()
for c in "${comps[@]}"; do
  case $c in
    conformance) expanded+=("${CONFORMANCE_TEST[@]/#/conformance-}") ;;
    conformance-all) expanded+=("${CONFORMANCE_ALL[@]/#/conformance-}") ;;
    cluster-autoscaler-test) expanded+=("${CA_BINARY_TEST[@]/#/cluster-autoscaler-}") ;;
    cluster-autoscaler-all) expanded+=("${CA_BINARY_ALL[@]/#/cluster-autoscaler-}") ;;
    cluster-autoscaler-patched)
      mapfile -t patched < <(ca_patches)
      [ ${#patched[@]} -gt 0 ] || die "no patches under tests/upstream/patches/cluster-autoscaler-*/"
      expanded+=("${patched[@]/#/cluster-autoscaler-}") ;;
    *) expanded+=("$c") ;;
  esac
done
comps=("${expanded[@]}")

mkdir -p "$OUT" "$WORK"
# one build at a time per output dir (parallel test binaries may call this script)
exec 9>"$OUT/.lock"; flock 9

rc=0
for c in "${comps[@]}"; do
  t0=$(date +%s)   # before the case: ensure_conformance_mod may generate go.mod/go.sum there
  case $c in
    etcd) fn=build_etcd key=$KEY_etcd ;;
    kube) fn=build_kube key=$KEY_kube ;;
    capi) fn=build_capi key=$KEY_capi ;;
    cluster-autoscaler|ca) fn=build_ca key=$KEY_ca ;;
    cluster-autoscaler-clusterapi-[0-9]*)
      v=${c#cluster-autoscaler-clusterapi-}
      [[ ",$CA_BINARY_ALL_VERSIONS," == *",$v,"* ]] && [ "$(ca_binary_tags "$v")" = externalgrpc ] \
        || die "unknown component '$c' (a release of CA_BINARY_ALL_VERSIONS built with externalgrpc alone: before 1.36)"
      fn="build_ca_binary $v clusterapi" key=$(ca_clusterapi_binary_key "$v") ;;
    cluster-autoscaler-[0-9]*.[0-9]*.[0-9]*-*)
      v=${c#cluster-autoscaler-} p=${c#cluster-autoscaler-*.*.*-}; v=${v%"-$p"}
      fn="build_ca_binary $v patch $p" key=$(ca_patched_binary_key "$v" "$p") ;;
    cluster-autoscaler-[0-9]*)
      v=${c#cluster-autoscaler-}
      [[ ",$CA_BINARY_ALL_VERSIONS," == *",$v,"* ]] || die "unknown component '$c' (CA_BINARY_ALL_VERSIONS: $CA_BINARY_ALL_VERSIONS)"
      fn="build_ca_binary $v" key=$(ca_binary_key "$v") ;;
    ca-source) fn=build_ca_source key=work/cluster-autoscaler-$CA_VERSION ;;
    ecosystem-crds) fn=build_ecosystem_crds key=$KEY_ecosystem ;;
    example-server) fn=build_example key=$KEY_example ;;
    kwok) fn=build_kwok key=$KEY_kwok ;;
    helm) fn=build_helm key=$KEY_helm ;;
    conformance-[0-9]*)
      v=${c#conformance-}
      [[ ",$CONFORMANCE_ALL_VERSIONS," == *",$v,"* ]] || die "unknown component '$c' (CONFORMANCE_ALL_VERSIONS: $CONFORMANCE_ALL_VERSIONS)"
      set +e; ( set -e; ensure_conformance_mod "$v" ); s=$?; set -e
      if [ $s -ne 0 ]; then echo "$c: FAILED generating its go.mod after $(( $(date +%s) - t0 ))s"; rc=1; continue; fi
      fn="build_conformance $v" key=$(conformance_key "$v") ;;
    cherry-check) fn=build_cherry_check key=$KEY_cherry_check ;;
    alicloud-check) fn=build_alicloud_check key=$KEY_alicloud_check ;;
    clusterapi-diff) fn=build_clusterapi_diff key=$KEY_clusterapi_diff ;;
    *) die "unknown component '$c' (known: ${ALL[*]} conformance-all conformance-<version> cluster-autoscaler-all cluster-autoscaler-<version> cluster-autoscaler-patched cluster-autoscaler-<version>-<patch>)" ;;
  esac
  if [ -d "$OUT/$key" ]; then state=cached; else state=built; fi
  set +e; ( set -e; $fn ); s=$?; set -e   # not in an `if`: that would switch off set -e inside
  if [ $s -eq 0 ]; then echo "$c: $state $key in $(( $(date +%s) - t0 ))s"
  else echo "$c: FAILED $key after $(( $(date +%s) - t0 ))s"; rc=1; fi
done
layout
exit $rc
