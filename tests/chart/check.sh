#!/usr/bin/env bash
# Static checks of the Helm chart and the shell scripts, run by .ci/run:
#   helm lint --strict; helm template with the default values and with
#   tests/chart/values-variant.yaml; the grace period computed from drain durations
#   (minutes, hours, combined); kubernetes-validate --strict on every rendered
#   built-in object (custom resources such as GatewayClass only warn); shellcheck on
#   every shell script. Applying the rendered chart to a real API server is the
#   `chart_applies_to_a_real_apiserver` test in tests/kubernetes/.
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

# The Kubernetes version the test API server runs (tests/k8s/apiserver/go.mod).
"$validate" --strict --quiet -k 1.34.0 "$out/default.yaml" "$out/variant.yaml"

if ! command -v shellcheck >/dev/null 2>&1; then
  apt-get update -q && apt-get install -y -q --no-install-recommends shellcheck
fi
shellcheck .ci/run examples/quickstart/run.sh benches/load/run.sh tests/k8s/build.sh tests/k8s/crds.sh tests/h2spec/install.sh \
  tests/promtool/install.sh tests/jaeger/install.sh tests/chart/*.sh tests/e2e/kind/*.sh tests/mesh/*.sh
echo "chart and scripts: ok"
