#!/usr/bin/env bash
# End-to-end check on a kind cluster: two teams' Gateways on their own addresses, a
# rolling restart without failed requests, a dedicated Gateway, then the Gateway
# API conformance suite against the "aether" class.
#
# Needs: docker, kind, kubectl, helm, go (for conformance), curl, on a Linux host
# (the script reaches MetalLB addresses on the kind network directly from the host).
# This project's CI machines have no container engine, so CI only shellchecks this
# script; run it yourself:
#
#   tests/e2e/kind/run.sh              # create, test, delete the cluster
#   KEEP=1 tests/e2e/kind/run.sh       # leave the cluster running afterwards
#   CONFORMANCE=0 tests/e2e/kind/run.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../../.." && pwd)"
cluster="${CLUSTER:-aether-e2e}"
image="${IMAGE:-aether-edge:e2e}"
gateway_api_version="${GATEWAY_API_VERSION:-v1.6.1}"
metallb_version="${METALLB_VERSION:-v0.14.9}"
conformance="${CONFORMANCE:-1}"
keep="${KEEP:-0}"

log() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

for tool in docker kind kubectl helm curl; do
  command -v "$tool" >/dev/null || fail "$tool is required"
done
if [[ "$conformance" == 1 ]]; then
  command -v go >/dev/null || fail "go is required for the conformance suite (or CONFORMANCE=0)"
fi

cleanup() {
  if [[ "$keep" != 1 ]]; then
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

log "cluster $cluster"
kind create cluster --name "$cluster" --wait 120s
kubectl config use-context "kind-$cluster"

log "image $image"
docker build -t "$image" "$root"
kind load docker-image "$image" --name "$cluster"

log "Gateway API CRDs $gateway_api_version"
kubectl apply --server-side -f \
  "https://github.com/kubernetes-sigs/gateway-api/releases/download/$gateway_api_version/standard-install.yaml"

log "MetalLB $metallb_version"
kubectl apply -f \
  "https://raw.githubusercontent.com/metallb/metallb/$metallb_version/config/manifests/metallb-native.yaml"
kubectl -n metallb-system wait --for=condition=Available deployment/controller --timeout=180s
kubectl -n metallb-system wait --for=condition=Ready pod -l component=speaker --timeout=180s
# Addresses from the top of the kind network's IPv4 subnet, which docker does not
# hand out to containers first.
subnet="$(docker network inspect kind -f '{{range .IPAM.Config}}{{println .Subnet}}{{end}}' | grep -E '^[0-9]+\.' | head -n1)"
[[ -n "$subnet" ]] || fail "no IPv4 subnet on the kind network"
prefix="$(cut -d. -f1-2 <<<"$subnet")"
kubectl apply -f - <<YAML
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: e2e, namespace: metallb-system}
spec: {addresses: ["$prefix.255.200-$prefix.255.250"]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: e2e, namespace: metallb-system}
YAML

log "chart"
helm upgrade --install aether-edge "$root/charts/aether-edge" \
  --namespace aether-system --create-namespace \
  --set image.repository="${image%:*}" --set image.tag="${image##*:}" \
  --set image.pullPolicy=Never \
  --wait --timeout 180s

log "demo: two teams, two Gateways"
for team in team-a team-b; do
  kubectl apply -f - <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: $team}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: $team}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: echo
        image: $image
        imagePullPolicy: Never
        args: [echo, --listen, "0.0.0.0:8080", --name, $team]
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: $team}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: $team}
spec:
  gatewayClassName: aether
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo, namespace: $team}
spec:
  parentRefs: [{name: edge}]
  hostnames: [$team.example.com]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
YAML
done
for team in team-a team-b; do
  kubectl -n "$team" wait --for=condition=Available deployment/echo --timeout=120s
  kubectl -n "$team" wait --for=condition=Programmed gateway/edge --timeout=120s
done

address() { kubectl -n "$1" get gateway edge -o jsonpath='{.status.addresses[0].value}'; }
ip_a="$(address team-a)"
ip_b="$(address team-b)"
echo "team-a: $ip_a  team-b: $ip_b"
[[ -n "$ip_a" && -n "$ip_b" ]] || fail "a Gateway has no address"
[[ "$ip_a" != "$ip_b" ]] || fail "both Gateways report $ip_a"

# Status code and body of GET / with a Host header, against an address.
get() { curl -sS -m 5 -o /tmp/aether-e2e-body -w '%{http_code}' -H "Host: $2" "http://$1/"; }
expect() {
  local ip="$1" host="$2" want="$3" name="${4:-}" code=""
  for _ in $(seq 1 30); do
    code="$(get "$ip" "$host" || true)"
    [[ "$code" == "$want" ]] && break
    sleep 1
  done
  [[ "$code" == "$want" ]] || fail "$host via $ip answered $code, want $want"
  if [[ -n "$name" ]]; then
    grep -q "\"name\":\"$name\"" /tmp/aether-e2e-body || fail "$host via $ip reached $(cat /tmp/aether-e2e-body)"
  fi
  echo "ok: $host via $ip -> $code ${name:+($name)}"
}
log "traffic: each address reaches only its own Gateway's routes"
expect "$ip_a" team-a.example.com 200 team-a
expect "$ip_b" team-b.example.com 200 team-b
expect "$ip_a" team-b.example.com 404
expect "$ip_b" team-a.example.com 404

log "internal ports and Services"
kubectl get svc -A -l app.kubernetes.io/managed-by=aether-edge -o wide
kubectl get endpointslices -A -l endpointslice.kubernetes.io/managed-by=edge.aether.io

log "rolling restart: no failed request"
failures=0
kubectl -n aether-system rollout restart deployment/aether-edge
deadline=$((SECONDS + 120))
while (( SECONDS < deadline )); do
  code="$(get "$ip_a" team-a.example.com || true)"
  [[ "$code" == 200 ]] || failures=$((failures + 1))
  if kubectl -n aether-system rollout status deployment/aether-edge --timeout=1s >/dev/null 2>&1; then
    break
  fi
done
echo "failed requests during the rollout: $failures"
(( failures == 0 )) || fail "$failures requests failed during a rolling restart"

log "dedicated Gateway: team-b gets pods of its own"
kubectl -n team-b annotate gateway edge aether.io/dedicated=true aether.io/dedicated-replicas=1 --overwrite
for _ in $(seq 1 60); do
  kubectl -n aether-system get deployment aether-team-b-edge >/dev/null 2>&1 && break
  sleep 1
done
kubectl -n aether-system wait --for=condition=Available deployment/aether-team-b-edge --timeout=120s
kubectl -n team-b wait gateway/edge --timeout=60s \
  --for=jsonpath='{.status.conditions[?(@.type=="aether.io/Dedicated")].status}'=True
pod_ips="$(kubectl -n aether-system get pods -l aether.io/dedicated=aether-team-b-edge -o jsonpath='{.items[*].status.podIP}')"
slice_ips=""
for _ in $(seq 1 30); do
  slice_ips="$(kubectl -n team-b get endpointslice edge-aether -o jsonpath='{.endpoints[*].addresses[0]}')"
  [[ "$slice_ips" == "$pod_ips" ]] && break
  sleep 1
done
[[ "$slice_ips" == "$pod_ips" ]] || fail "team-b's Service names $slice_ips, not its own pods $pod_ips"
expect "$ip_b" team-b.example.com 200 team-b
expect "$ip_a" team-a.example.com 200 team-a
kubectl -n team-b annotate gateway edge aether.io/dedicated- aether.io/dedicated-replicas-
kubectl -n aether-system wait --for=delete deployment/aether-team-b-edge --timeout=60s
expect "$ip_b" team-b.example.com 200 team-b

if [[ "$conformance" == 1 ]]; then
  log "Gateway API conformance $gateway_api_version"
  src="$(mktemp -d)"
  git clone -q --depth 1 --branch "$gateway_api_version" https://github.com/kubernetes-sigs/gateway-api "$src"
  (
    cd "$src"
    go test ./conformance -run TestConformance -timeout 60m -v -args \
      --gateway-class=aether \
      --supported-features=Gateway,HTTPRoute,ReferenceGrant,HTTPRouteQueryParamMatching,HTTPRouteMethodMatching,HTTPRouteResponseHeaderModification,HTTPRouteSchemeRedirect,HTTPRouteHostRewrite,HTTPRoutePathRewrite,HTTPRoutePathRedirect,HTTPRoutePortRedirect,HTTPRouteRequestMirror,HTTPRouteRequestMultipleMirrors,HTTPRouteRequestTimeout,HTTPRouteBackendTimeout \
      --organization=aether --project=aether-edge --version=0.1.0 \
      --url=https://github.com/aether-mesh/aether-edge --contact=aether-edge-maintainers \
      --report-output="$root/target/conformance-report.yaml"
  )
  echo "conformance report: $root/target/conformance-report.yaml"
fi
log "e2e passed"
