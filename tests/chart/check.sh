#!/usr/bin/env bash
# Static checks of the Helm chart and the shell scripts, run by .ci/run:
#   helm lint --strict; helm template with the default values and with
#   tests/chart/values-variant.yaml; the grace period computed from drain durations
#   (minutes, hours, combined); the ServiceMonitor, PodMonitor and dashboard
#   ConfigMap (off by default; on, scraping the admin port's /metrics of the right
#   pods, and the dashboard file unchanged); the packaged charts (charts/package.sh: the
#   CRDs chart holds the bundle with the GEP-5093 patch); kubernetes-validate --strict
#   on every rendered built-in object (custom resources such as GatewayClass only warn),
#   then shellcheck on every shell script; actionlint on .github/workflows/. Applying the
#   rendered chart to a real API server is the `chart_applies_to_a_real_apiserver` test
#   in tests/kubernetes/, installing the packaged charts with Helm is crds_chart.rs.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
helm="$(bash tests/chart/tools.sh)"
validate="$root/target/tools/venv/bin/kubernetes-validate"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$helm" lint --strict charts/aether-edge
"$helm" lint --strict charts/aether-edge -f tests/chart/values-variant.yaml
"$helm" template aether-edge charts/aether-edge --namespace aether-system >"$out/default.yaml"
"$helm" template edge charts/aether-edge --namespace edge -f tests/chart/values-variant.yaml >"$out/variant.yaml"

# terminationGracePeriodSeconds is drainDelay + drainTimeout + 5 s, from durations
# parsed by the chart: every unit the binary's flags take, alone and combined. A
# shorter grace period lets the kubelet kill pods mid-drain.
grace_is() {
  local delay="$1" timeout="$2" want="$3" got
  got="$("$helm" template g charts/aether-edge --set "dedicated.enabled=true" \
    --set "drainDelay=$delay" --set "drainTimeout=$timeout" |
    awk '/terminationGracePeriodSeconds:/ {print $2}' | sort -u | tr '\n' ' ')"
  if [[ "$got" != "$want " ]]; then
    echo "drainDelay=$delay drainTimeout=$timeout: terminationGracePeriodSeconds $got, want $want" >&2
    exit 1
  fi
}
grace_is 5s 30s 40
grace_is 1m30s 2m 215
grace_is 0s 1h 3605
grace_is 1h2m3s 500ms 3729
# Each duration rounds up on its own: 1 s + 2 s + 5 s.
grace_is 250ms 1500ms 8
grace_is 0 10s 15
# A duration the chart cannot read fails the render instead of guessing.
if "$helm" template g charts/aether-edge --set drainTimeout=2min >/dev/null 2>&1; then
  echo "drainTimeout=2min rendered; it should fail" >&2
  exit 1
fi

# What a user sets for a registry, a cloud load balancer and autoscaling reaches the
# objects; the schema (values.schema.json) refuses a misspelt or mistyped value.
has_in() { grep -qE -- "$2" "$1" || { echo "chart: $3" >&2; exit 1; }; }
has_in "$out/variant.yaml" '^kind: HorizontalPodAutoscaler$' "no HPA with autoscaling.enabled"
has_in "$out/variant.yaml" 'averageUtilization: 60$' "HPA target not from values"
has_in "$out/variant.yaml" '^ +- name: regcred$' "no imagePullSecrets in the pod"
has_in "$out/variant.yaml" 'aws-load-balancer-type: nlb$' "no Service annotation"
has_in "$out/variant.yaml" '^  externalTrafficPolicy: Local$' "no externalTrafficPolicy"
has_in "$out/variant.yaml" '^  loadBalancerClass: example.com/lb$' "no loadBalancerClass"
if grep -qE '^kind: HorizontalPodAutoscaler$' "$out/default.yaml"; then
  echo "chart: an HPA by default" >&2
  exit 1
fi
if awk '/^kind: Deployment$/ {d = 1} d && /^  replicas:/ {print; exit}' "$out/variant.yaml" | grep -q replicas; then
  echo "chart: the Deployment sets replicas while the HPA owns them" >&2
  exit 1
fi
for bad in replicaCount=two servce.type=LoadBalancer service.type=Ingress drainTimeout=2min; do
  if "$helm" template g charts/aether-edge --set "$bad" >/dev/null 2>&1; then
    echo "chart: --set $bad rendered; the schema should refuse it" >&2
    exit 1
  fi
done
# What a user installs from a registry: the packaged charts (charts/package.sh), linted
# as such. The CRDs chart holds every CRD of the module's experimental bundle, each kept
# on uninstall, and the Gateway CRD with `routability` in spec and status of both served
# versions (the GEP-5093 patch applied, not lost on the way).
bash charts/package.sh "$out/package" >/dev/null
"$helm" lint --strict "$out/package/aether-edge-0"*.tgz >/dev/null
"$helm" lint --strict "$out/package/aether-edge-crds-"*.tgz >/dev/null
"$helm" template crds "$out/package/aether-edge-crds-"*.tgz >"$out/crds.yaml"
bundle="$(bash tests/k8s/crds.sh)/config/crd/experimental"
want="$(grep -l '^kind: CustomResourceDefinition$' "$bundle"/*.yaml |
  while read -r f; do grep -qx -- "- $(basename "$f")" "$bundle/kustomization.yaml" && awk '/^  name: / {print $2; exit}' "$f"; done | sort)"
got="$(awk '/^kind: CustomResourceDefinition$/ {c = 1} c && /^  name: / {print $2; c = 0}' "$out/crds.yaml" | sort)"
[[ -n "$want" && "$got" == "$want" ]] || { echo "CRDs chart holds: $got; the bundle has: $want" >&2; exit 1; }
[[ "$(grep -c '^    helm.sh/resource-policy: keep$' "$out/crds.yaml")" == "$(wc -l <<<"$want")" ]] ||
  { echo "CRDs chart: not every CRD has helm.sh/resource-policy: keep" >&2; exit 1; }
"$helm" template crds "$out/package/aether-edge-crds-"*.tgz --show-only templates/gateway.networking.k8s.io_gateways.yaml |
  "$root/target/tools/venv/bin/python" -c '
import sys, yaml
crd = yaml.safe_load(sys.stdin)
for v in crd["spec"]["versions"]:
    props = v["schema"]["openAPIV3Schema"]["properties"]
    for part in ("spec", "status"):
        items = props[part]["properties"]["addresses"]["items"]["properties"]
        assert "routability" in items, (v["name"], part)
' || { echo "CRDs chart: the Gateway CRD lacks the GEP-5093 patch" >&2; exit 1; }

# Monitoring: nothing by default. Switched on: a ServiceMonitor selecting the edge
# Service (the one with the admin port), a PodMonitor selecting every edge pod of the
# release (dedicated Gateways' pods keep the label through the pod-template ConfigMap),
# both scraping the admin port's /metrics, and the dashboard file as a ConfigMap.
fail() { echo "chart monitoring: $*" >&2; exit 1; }
if grep -qE '^kind: (ServiceMonitor|PodMonitor)$|grafana_dashboard' "$out/default.yaml"; then
  fail "the default render has a monitor or the dashboard ConfigMap"
fi
mon=(mon charts/aether-edge --namespace monitoring --set adminPort=9555
  --set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.labels.release=kps
  --set metrics.podMonitor.enabled=true --set metrics.dashboard.enabled=true)
"$helm" template "${mon[@]}" >"$out/monitoring.yaml"
show() { "$helm" template "${mon[@]}" --show-only "templates/$1"; }
# has FILE-TEXT PATTERN WHAT: fail unless a line matches PATTERN (extended regexp).
has() { grep -qE "$2" <<<"$1" || fail "$3"; }
sm="$(show servicemonitor.yaml)"
has "$sm" '^kind: ServiceMonitor$' "no ServiceMonitor"
has "$sm" '^  namespace: monitoring$' "ServiceMonitor not in the release namespace"
has "$sm" '^    release: kps$' "ServiceMonitor without its extra label"
has "$sm" '^      - monitoring$' "ServiceMonitor namespaceSelector is not the release namespace"
has "$(awk '/^  selector:/,/^  endpoints:/' <<<"$sm")" '^      app.kubernetes.io/instance: mon$' "ServiceMonitor does not select the release's Service"
has "$sm" '^    - port: admin$' "ServiceMonitor does not scrape port admin"
has "$sm" '^      path: /metrics$' "ServiceMonitor does not scrape /metrics"
svc="$(show service.yaml)"
has "$svc" '^    app.kubernetes.io/instance: mon$' "the edge Service lacks the label the ServiceMonitor selects"
has "$(grep -A1 -- '- name: admin' <<<"$svc")" 'port: 9555' "the edge Service's admin port is not adminPort"
pm="$(show podmonitor.yaml)"
has "$pm" '^kind: PodMonitor$' "no PodMonitor"
has "$(awk '/^  selector:/,/^  podMetricsEndpoints:/' <<<"$pm")" '^      aether.io/edge: mon-aether-edge$' "PodMonitor does not select aether.io/edge"
has "$pm" '^    - port: admin$' "PodMonitor does not scrape port admin"
has "$pm" '^      path: /metrics$' "PodMonitor does not scrape /metrics"
dep="$(show deployment.yaml)"
has "$dep" '^        aether.io/edge: mon-aether-edge$' "the edge pods lack the label the PodMonitor selects"
has "$(grep -A1 -- '- name: admin' <<<"$dep")" 'containerPort: 9555' "the pods' admin port is not adminPort"
has "$(show dedicated-configmap.yaml)" '^        aether.io/edge: mon-aether-edge$' "dedicated pods' template lacks the PodMonitor's label"
dash="$(show dashboard-configmap.yaml)"
has "$dash" '^    grafana_dashboard: "1"$' "the dashboard ConfigMap lacks the grafana_dashboard label"
# The ConfigMap holds the dashboard file unchanged.
diff <(awk 'f { sub(/^    /, ""); print } /^  aether-edge.json: \|-$/ { f = 1 }' <<<"$dash") \
  charts/aether-edge/dashboards/aether-edge.json >/dev/null || fail "the dashboard ConfigMap differs from dashboards/aether-edge.json"

# The Kubernetes version the test API server runs (tests/k8s/apiserver/go.mod).
"$validate" --strict --quiet -k 1.34.0 "$out/default.yaml" "$out/variant.yaml" "$out/monitoring.yaml"

if ! command -v shellcheck >/dev/null 2>&1; then
  # apt-gets serialised: tests run at once, and dpkg's lock fails the loser.
  flock /tmp/aether-apt.lock apt-get update -q && flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends shellcheck
fi
shellcheck .ci/run examples/quickstart/run.sh benches/load/run.sh tests/k8s/build.sh tests/k8s/crds.sh tests/h2spec/install.sh \
  tests/promtool/install.sh tests/jaeger/install.sh tests/chart/*.sh tests/e2e/kind/*.sh tests/e2e/cluster/*.sh tests/mesh/*.sh \
  tests/k8s/monitoring-crds.sh tests/image/tools.sh charts/package.sh tests/actionlint/install.sh image/build.sh benches/load/syscalls.sh \
  benches/load/allocations.sh benches/load/profile.sh benches/load/upstream.sh benches/load/side-by-side.sh \
  benches/load/side-by-side-runs.sh benches/load/nginx-as-edge.sh
# The release workflow runs only on GitHub (on a tag): lint it here.
"$(bash tests/actionlint/install.sh)" .github/workflows/*.yml
echo "chart and scripts: ok"
