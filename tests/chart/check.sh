#!/usr/bin/env bash
# Static checks of the Helm chart and the shell scripts, run by .ci/run:
#   helm lint --strict; helm template with the default values and with
#   tests/chart/values-variant.yaml; kubernetes-validate --strict on every rendered
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
# The Kubernetes version the test API server runs (tests/k8s/apiserver/go.mod).
"$validate" --strict --quiet -k 1.34.0 "$out/default.yaml" "$out/variant.yaml"

if ! command -v shellcheck >/dev/null 2>&1; then
  apt-get update -q && apt-get install -y -q --no-install-recommends shellcheck
fi
shellcheck .ci/run examples/quickstart/run.sh benches/load/run.sh tests/k8s/build.sh \
  tests/chart/*.sh tests/e2e/kind/*.sh tests/mesh/*.sh
echo "chart and scripts: ok"
