#!/usr/bin/env bash
# End to end on the cluster run.sh brings up (`run.sh e2e`, after `run.sh up`), as a
# user would see it: two teams' Gateways, each with its own Service and load-balancer
# address, traffic through them to real pods selected by real Services; each address
# reaches only its own Gateway's routes; a `helm upgrade` of the edge to another image
# tag and a `helm rollback`, each a rolling replacement of every edge pod, under load
# with no failed request; a Gateway moved to dedicated pods (Phase 3) and back, also
# under load with no failed request. Everything goes through kubectl, Helm and curl inside the cluster's
# network namespace (`run.sh exec`). Bounded: every wait has a limit, the load runs
# only while a rollout does (at most ROLL_LIMIT seconds each).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
top="${CARGO_TARGET_DIR:-$root/target}/cluster"
roll_limit="${ROLL_LIMIT:-240}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

log() { printf '== e2e: %s (%ss)\n' "$*" "$SECONDS" >&2; }
fail() { printf 'FAIL: e2e: %s\n' "$*" >&2; exit 1; }
x() { "$here/run.sh" exec "$@"; }
kc() { x kubectl "$@"; }
helm_() { x "$top/bin/helm" "$@"; }
[[ -f "$top/state/admin.kubeconfig" ]] || fail "no cluster: run '$here/run.sh up' first"

# A previous run deletes its namespaces without waiting: applying into one still
# terminating fails, so a run right after another waits for them to be gone.
kc wait --for=delete namespace/team-a namespace/team-b --timeout=120s >/dev/null 2>&1 || true

log "two teams: an echo Deployment and Service each, a Gateway and an HTTPRoute"
for team in team-a team-b; do
  kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: $team}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: $team}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: echo
        image: aether-edge:cluster
        imagePullPolicy: Never
        args: [echo, --listen, "0.0.0.0:8080", --name, $team]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
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
  kc -n "$team" wait --for=condition=Available deployment/echo --timeout=120s >/dev/null
  kc -n "$team" wait --for=condition=Programmed gateway/edge --timeout=120s >/dev/null
done

address() { kc -n "$1" get gateway edge -o jsonpath='{.status.addresses[0].value}'; }
ip_a="$(address team-a)"
ip_b="$(address team-b)"
log "addresses: team-a $ip_a, team-b $ip_b"
[[ -n "$ip_a" && -n "$ip_b" ]] || fail "a Gateway has no address"
[[ "$ip_a" != "$ip_b" ]] || fail "both Gateways report $ip_a"
for team in team-a team-b; do
  svc_ip="$(kc -n "$team" get service edge-aether -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
  [[ "$svc_ip" == "$(address "$team")" ]] || fail "$team: Gateway address $(address "$team"), its Service's $svc_ip"
  owner="$(kc -n "$team" get service edge-aether -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}')"
  [[ "$owner" == Gateway/edge ]] || fail "$team: Service edge-aether owned by '$owner'"
done

# expect ADDR HOST CODE [NAME]: GET / until it answers CODE (30 s), and NAME's backend.
expect() {
  local ip="$1" host="$2" want="$3" name="${4:-}" code=""
  for _ in $(seq 1 30); do
    code="$(x curl -sS -m 5 -o "$work/body" -w '%{http_code}' -H "Host: $host" "http://$ip/" 2>/dev/null || true)"
    [[ "$code" == "$want" ]] && break
    sleep 1
  done
  [[ "$code" == "$want" ]] || fail "$host via $ip answered '$code', want $want"
  if [[ -n "$name" ]]; then
    grep -q "\"name\":\"$name\"" "$work/body" || fail "$host via $ip reached $(cat "$work/body")"
  fi
  log "$host via $ip: $code${name:+ from $name}"
}
log "traffic: each address reaches its own Gateway's routes only"
expect "$ip_a" team-a.example.com 200 team-a
expect "$ip_b" team-b.example.com 200 team-b
expect "$ip_a" team-b.example.com 404
expect "$ip_b" team-a.example.com 404
# load ADDR HOST NAME: requests until $work/stop exists, counting answers by status.
# Two clients: one new connection per request, one reusing keep-alive connections
# (batches of 50 requests per curl), so both a fresh connect and a connection open
# across a pod's drain are exercised.
load() {
  local ip="$1" host="$2" name="$3"
  # shellcheck disable=SC2016 # expanded by the inner bash, inside the namespace
  x bash -c '
    while [[ ! -e "$1/stop" ]]; do
      curl -s -m 5 -o /dev/null -w "%{http_code}\n" -H "Host: $3" "http://$2/" || echo "curl-exit-$?"
    done >"$1/$4.fresh"' load "$work" "$ip" "$host" "$name" &
  # shellcheck disable=SC2016
  x bash -c '
    urls=(); for _ in $(seq 1 50); do urls+=(-o /dev/null "http://$2/"); done
    while [[ ! -e "$1/stop" ]]; do
      curl -s -m 5 -w "%{http_code}\n" -H "Host: $3" "${urls[@]}" || echo "curl-exit-$?"
    done >"$1/$4.kept"' load "$work" "$ip" "$host" "$name" &
}

# load_start / load_stop WHAT: requests to both Gateways between the two; load_stop
# fails on any answer but 200.
load_start() {
  rm -f "$work/stop" "$work"/{a,b}.{fresh,kept}
  load "$ip_a" team-a.example.com a
  load "$ip_b" team-b.example.com b
  load_t0=$SECONDS
  sleep 2
}
load_stop() {
  local what="$1" total=0 bad=0 f n b
  touch "$work/stop"
  wait
  for f in a.fresh a.kept b.fresh b.kept; do
    n="$(wc -l <"$work/$f")"
    b="$(grep -cvx 200 "$work/$f" || true)"
    log "$what: $f: $n requests, $b failed$( ((b == 0)) || printf ' (%s)' "$(grep -vx 200 "$work/$f" | sort | uniq -c | tr -s ' \n' ' ')")"
    total=$((total + n)) bad=$((bad + b))
  done
  log "$what: $total requests in $((SECONDS - load_t0))s, $bad failed"
  ((total > 100)) || fail "$what: only $total requests were sent"
  ((bad == 0)) || fail "$what: $bad requests failed"
}

# rollout WHAT CMD...: CMD (which rolls the edge Deployment) under load on both
# Gateways.
rollout() {
  local what="$1"
  shift
  load_start
  "$@" >/dev/null
  kc -n aether-system rollout status deployment/aether-edge --timeout="${roll_limit}s" >/dev/null ||
    { touch "$work/stop"; wait; fail "$what: the rollout did not finish in ${roll_limit}s"; }
  # The last old pod drains after the rollout reports done: keep the load on through it.
  sleep 10
  load_stop "$what"
}

pods_before="$(kc -n aether-system get pods -l app.kubernetes.io/name=aether-edge -o jsonpath='{.items[*].metadata.name}')"
log "rolling upgrade: helm upgrade to image tag 'upgrade' (the same build, tagged anew)"
x ctr --address "$top/state/containerd.sock" -n k8s.io images tag --force \
  docker.io/library/aether-edge:cluster docker.io/library/aether-edge:upgrade >/dev/null
chart_version="$(awk '/^version:/ {print $2; exit}' "$root/charts/aether-edge/Chart.yaml")"
rollout "helm upgrade" helm_ upgrade aether-edge "$top/charts/aether-edge-$chart_version.tgz" -n aether-system \
  --reuse-values --set image.tag=upgrade
image="$(kc -n aether-system get deployment aether-edge -o jsonpath='{.spec.template.spec.containers[0].image}')"
[[ "$image" == aether-edge:upgrade ]] || fail "after the upgrade the Deployment runs $image"
pods_after="$(kc -n aether-system get pods -l app.kubernetes.io/name=aether-edge -o jsonpath='{.items[*].metadata.name}')"
for p in $pods_before; do
  grep -qw "$p" <<<"$pods_after" && fail "pod $p survived the upgrade: nothing rolled"
done
log "rollback: helm rollback to the first revision"
rollout "helm rollback" helm_ rollback aether-edge 1 -n aether-system
image="$(kc -n aether-system get deployment aether-edge -o jsonpath='{.spec.template.spec.containers[0].image}')"
[[ "$image" == aether-edge:cluster ]] || fail "after the rollback the Deployment runs $image"
for team in team-a team-b; do
  kc -n "$team" wait --for=condition=Programmed gateway/edge --timeout=60s >/dev/null
done

log "dedicated Gateway: team-b gets pods of its own (Phase 3), under load"
load_start
kc -n team-b annotate gateway edge aether.io/dedicated=true aether.io/dedicated-replicas=1 --overwrite >/dev/null
for _ in $(seq 1 60); do
  kc -n aether-system get deployment aether-team-b-edge >/dev/null 2>&1 && break
  sleep 1
done
kc -n aether-system wait --for=condition=Available deployment/aether-team-b-edge --timeout=120s >/dev/null
kc -n team-b wait gateway/edge --timeout=60s \
  --for=jsonpath='{.status.conditions[?(@.type=="aether.io/Dedicated")].status}'=True >/dev/null
pod_ips="$(kc -n aether-system get pods -l aether.io/dedicated=aether-team-b-edge -o jsonpath='{.items[*].status.podIP}')"
slice_ips=""
for _ in $(seq 1 30); do
  slice_ips="$(kc -n team-b get endpointslice edge-aether -o jsonpath='{.endpoints[*].addresses[0]}')"
  [[ -n "$pod_ips" && "$slice_ips" == "$pod_ips" ]] && break
  sleep 1
done
[[ -n "$pod_ips" && "$slice_ips" == "$pod_ips" ]] || { touch "$work/stop"; wait; fail "team-b's Service names '$slice_ips', not its own pods '$pod_ips'"; }
log "team-b's Service names its own pod(s) $pod_ips"
# Kept through a few of the cluster's EndpointSlice updates: it must not flap back.
sleep 10
# The shared pods keep serving the handed-over Gateway for their drain delay (the
# linger, 10adac1) while kube-proxy applies the new endpoints: not one request may fail.
load_stop "move to dedicated pods"
slice_ips="$(kc -n team-b get endpointslice edge-aether -o jsonpath='{.endpoints[*].addresses[0]}')"
[[ "$slice_ips" == "$pod_ips" ]] || fail "team-b's Service names '$slice_ips' 10 s later, not '$pod_ips'"
expect "$ip_b" team-b.example.com 200 team-b
expect "$ip_a" team-a.example.com 200 team-a
expect "$ip_b" team-a.example.com 404
log "and back to the shared pods, under load"
load_start
kc -n team-b annotate gateway edge aether.io/dedicated- aether.io/dedicated-replicas- >/dev/null
kc -n aether-system wait --for=delete deployment/aether-team-b-edge --timeout=60s >/dev/null 2>&1 || true
kc -n aether-system get deployment aether-team-b-edge >/dev/null 2>&1 && { touch "$work/stop"; wait; fail "the dedicated Deployment is still there"; }
sleep 10
load_stop "move back to the shared pods"
expect "$ip_b" team-b.example.com 200 team-b
expect "$ip_a" team-a.example.com 200 team-a

log "clean up the teams"
kc delete namespace team-a team-b --wait=false >/dev/null
log "passed"
