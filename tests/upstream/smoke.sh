#!/usr/bin/env bash
# Smoke test of the built peers (no Rust needed): etcd + kube-apiserver on 127.0.0.1 with random
# ports and throwaway openssl PKI, /readyz, Cluster API CRDs created and Established, then teardown.
#   tests/upstream/build.sh etcd kube capi && tests/upstream/smoke.sh
# KEEP=1 leaves the temp dir (logs, kubeconfig) behind.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
U=${UPSTREAM_OUT:-$ROOT/target/upstream}
B=$U/bin
D=$(mktemp -d /tmp/upstream-smoke.XXXXXX)
PIDS=()
cleanup() { # reverse start order (apiserver before etcd), SIGTERM then SIGKILL after 10 s
  local i p t0=$(date +%s.%N)
  for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
    p=${PIDS[i]}; kill -TERM "$p" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  echo "teardown took $(echo "$(date +%s.%N) - $t0" | bc)s"
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ETCD=$(freeport) PEER=$(freeport) API=$(freeport)
mkdir -p "$D/pki" "$D/etcd" "$D/logs"
P=$D/pki

# --- PKI: CA, apiserver serving cert, admin client cert (system:masters), SA key, token file ---
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=sandbox-ca \
  -keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
leaf() { # name subj ext
  openssl req -new -newkey rsa:2048 -nodes -subj "$2" -keyout "$P/$1.key" -out "$P/$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$P/$1.ext"
  openssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 2 \
    -extfile "$P/$1.ext" -out "$P/$1.crt" 2>/dev/null
}
leaf apiserver /CN=kube-apiserver "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
leaf admin "/O=system:masters/CN=sandbox-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$P/sa.key" 2>/dev/null
TOKEN=$(openssl rand -hex 16)
echo "$TOKEN,sandbox-admin,uid-admin,\"system:masters\"" >"$D/tokens.csv"
cat >"$D/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster: {server: "https://127.0.0.1:$API", certificate-authority: "$P/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$P/admin.crt", client-key: "$P/admin.key"}
contexts:
- name: sandbox
  context: {cluster: sandbox, user: admin}
current-context: sandbox
EOF
K() { "$B/kubectl" --kubeconfig="$D/admin.kubeconfig" "$@"; }
wait_url() { # url secs [curl args]
  local u=$1 n=$(( $2 * 10 )); shift 2
  for _ in $(seq "$n"); do curl -fsS "$@" "$u" >/dev/null 2>&1 && return 0; sleep 0.1; done
  curl -sS "$@" "$u" || true; return 1
}

# --- etcd ---
t0=$(date +%s.%N)
"$B/etcd" --name=node0 --data-dir="$D/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD" --advertise-client-urls="http://127.0.0.1:$ETCD" \
  --listen-peer-urls="http://127.0.0.1:$PEER" --initial-advertise-peer-urls="http://127.0.0.1:$PEER" \
  --initial-cluster="node0=http://127.0.0.1:$PEER" \
  --auto-compaction-retention=1 --quota-backend-bytes=8589934592 \
  --unsafe-no-fsync=true --log-level=warn >"$D/logs/etcd.log" 2>&1 &
PIDS+=($!)
wait_url "http://127.0.0.1:$ETCD/readyz" 20 || { tail -20 "$D/logs/etcd.log"; exit 1; }
echo "etcd ready on :$ETCD after $(echo "$(date +%s.%N) - $t0" | bc)s"

# --- kube-apiserver ---
t0=$(date +%s.%N)
"$B/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD" --etcd-prefix=/registry \
  --bind-address=127.0.0.1 --secure-port="$API" --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --token-auth-file="$D/tokens.csv" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.key" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --authorization-mode=RBAC --allow-privileged=true \
  --cert-dir="$D/apiserver-certs" >"$D/logs/kube-apiserver.log" 2>&1 &
PIDS+=($!)
wait_url "https://127.0.0.1:$API/readyz" 60 --cacert "$P/ca.crt" \
  || { tail -30 "$D/logs/kube-apiserver.log"; exit 1; }
echo "kube-apiserver ready on :$API after $(echo "$(date +%s.%N) - $t0" | bc)s"

K version -o json | python3 -c 'import json,sys; v=json.load(sys.stdin); print("client", v["clientVersion"]["gitVersion"], "server", v["serverVersion"]["gitVersion"])'
# bearer token from --token-auth-file
curl -fsS --cacert "$P/ca.crt" -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API/apis/authentication.k8s.io/v1/selfsubjectreviews" \
  -X POST -H 'Content-Type: application/json' -d '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
  | python3 -c 'import json,sys; u=json.load(sys.stdin)["status"]["userInfo"]; print("token auth ok:", u["username"], u["groups"])'

# --- Cluster API CRDs ---
if [ -d "$U/capi-crds" ]; then
  t0=$(date +%s.%N)
  K create -f "$U/capi-crds/" >/dev/null
  K wait --for=condition=Established --timeout=60s -f "$U/capi-crds/" >/dev/null
  echo "$(ls "$U"/capi-crds/*.yaml | wc -l) CAPI CRDs Established after $(echo "$(date +%s.%N) - $t0" | bc)s"
  K api-resources --api-group=cluster.x-k8s.io -o name | tr '\n' ' '; echo
fi
# --- Cluster API core manager (needs the CRDs and a webhook serving cert, nothing registered) ---
if [ -x "$B/capi-manager" ] && [ -d "$U/capi-crds" ]; then
  WH=$(freeport) HEALTH=$(freeport)
  mkdir -p "$D/capi-webhook"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$D/capi-webhook/tls.key" -out "$D/capi-webhook/tls.crt" 2>/dev/null
  t0=$(date +%s.%N)
  "$B/capi-manager" --kubeconfig="$D/admin.kubeconfig" --leader-elect=false \
    --webhook-port="$WH" --webhook-cert-dir="$D/capi-webhook" \
    --health-addr="127.0.0.1:$HEALTH" --diagnostics-address=0 \
    --feature-gates=MachinePool=true,ClusterTopology=false >"$D/logs/capi-manager.log" 2>&1 &
  PIDS+=($!)
  wait_url "http://127.0.0.1:$HEALTH/readyz" 60 || { tail -30 "$D/logs/capi-manager.log"; exit 1; }
  echo "capi-manager ready (webhook :$WH, health :$HEALTH) after $(echo "$(date +%s.%N) - $t0" | bc)s"
fi
# --- kwok: one fake node goes Ready, a pod bound to it goes Running ---
if [ -x "$B/kwok" ] && [ -d "$U/kwok-stages" ]; then
  KW=$(freeport)
  t0=$(date +%s.%N)
  KWOK_WORKDIR="$D" "$B/kwok" --kubeconfig="$D/admin.kubeconfig" --config="$U/kwok-stages/default.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 --cidr=10.244.0.0/16 --node-ip=10.0.0.1 \
    --server-address="127.0.0.1:$KW" >"$D/logs/kwok.log" 2>&1 &
  PIDS+=($!)
  wait_url "http://127.0.0.1:$KW/healthz" 30 || { tail -30 "$D/logs/kwok.log"; exit 1; }
  # no kube-controller-manager here, so create the SA the ServiceAccount admission plugin wants
  K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: default}
---
apiVersion: v1
kind: Node
metadata:
  name: fake-0
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: fake-0, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
spec: {providerID: "sandbox://fake-0"}
status:
  capacity: {cpu: "4", memory: 16Gi, pods: "110"}
  allocatable: {cpu: "4", memory: 16Gi, pods: "110"}
---
apiVersion: v1
kind: Pod
metadata: {name: p0, namespace: default}
spec:
  nodeName: fake-0
  containers: [{name: c, image: fake}]
EOF
  K wait --for=condition=Ready --timeout=30s node/fake-0 >/dev/null
  K wait --for=jsonpath='{.status.phase}'=Running --timeout=30s -n default pod/p0 >/dev/null
  echo "kwok: node Ready + pod Running after $(echo "$(date +%s.%N) - $t0" | bc)s" \
    "(podIP $(K get pod p0 -n default -o jsonpath='{.status.podIP}'), $(K get lease -n kube-node-lease fake-0 -o name))"
fi
echo "smoke OK"
