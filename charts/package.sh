#!/usr/bin/env bash
# Packages what a user installs with Helm into OUT_DIR (default target/charts/) and
# prints OUT_DIR. Needs Go (the CRDs come from the Go module proxy):
#   aether-edge-crds-<version>.tgz  the Gateway API CRDs, experimental channel, taken from
#                                   the sigs.k8s.io/gateway-api Go module (tests/k8s/crds.sh)
#                                   with the GEP-5093 patch (crd-patches/) applied, as templates
#   aether-edge-<version>.tgz       the edge (charts/aether-edge)
#
# The CRDs are a chart of their own, as templates rather than a crds/ directory, because
# Helm installs crds/ once and never upgrades it: `helm upgrade aether-edge-crds` is how a
# newer bundle arrives, and it re-applies the patch every time, so re-applying CRDs never
# drops `routability`. They carry helm.sh/resource-policy: keep: uninstalling the chart
# must not delete the CRDs and with them every Gateway and route in the cluster. They
# cannot share a release with the edge chart: Helm checks every kind of a release against
# the API server before creating anything, and the GatewayClass would name a kind that
# does not exist yet.
#
# The safe-upgrades ValidatingAdmissionPolicy of the bundle is left out: it belongs to the
# standard channel and refuses experimental CRDs (docs/install.md says what to do when a
# cluster already has it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/target/charts}" && cd "${1:-$root/target/charts}" && pwd)"
# HELM and KUBECTL name your own; otherwise the pinned ones tests/chart/tools.sh installs
# under target/tools/. `kubectl patch --local` applies the JSON patch with the API
# server's own patch code, offline.
if [[ -n "${HELM:-}" && -n "${KUBECTL:-}" ]]; then
  helm="$HELM" kubectl="$KUBECTL"
else
  helm="$(bash "$root/tests/chart/tools.sh")"
  kubectl="$(dirname "$(dirname "$helm")")/kubectl/kubectl"
fi
module="$(bash "$root/tests/k8s/crds.sh")"
bundle="$(basename "$module")"
bundle_version="${bundle#gateway-api-}"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

chart_version="$(awk '/^version:/ {print $2; exit}' "$root/charts/aether-edge/Chart.yaml")"
crds="$stage/aether-edge-crds"
mkdir -p "$crds/templates"
cat >"$crds/Chart.yaml" <<YAML
apiVersion: v2
name: aether-edge-crds
description: Gateway API CRDs $bundle_version (experimental channel) with the GEP-5093 routability field, for aether-edge
type: application
version: $chart_version
appVersion: "$bundle_version"
kubeVersion: ">=1.29.0-0"
home: https://github.com/aether-mesh/aether-edge
YAML

# The bundle is what the channel's kustomization lists (the directory also holds CRDs
# still in development that no release installs).
n=0
dir="$module/config/crd/experimental"
while read -r name; do
  f="$dir/$name"
  grep -q '^kind: CustomResourceDefinition$' "$f" || continue
  # Templates are rendered by Helm: a CRD carrying template syntax would be rewritten.
  if grep -q '{{' "$f"; then
    echo "$name contains '{{': it would need escaping to be a Helm template" >&2
    exit 1
  fi
  src="$f"
  if [[ "$name" == gateway.networking.k8s.io_gateways.yaml ]]; then
    "$kubectl" patch --local -f "$f" --type=json \
      --patch-file "$root/charts/aether-edge/crd-patches/gateway-routability.yaml" -o yaml >"$stage/gateways.yaml"
    src="$stage/gateways.yaml"
  fi
  "$kubectl" annotate --local -f "$src" helm.sh/resource-policy=keep -o yaml >"$crds/templates/$name"
  n=$((n + 1))
done < <(awk '/^resources:/ {r = 1; next} r && /^- / {print $2}' "$dir/kustomization.yaml")
[[ $n -gt 0 ]] || { echo "no CRDs in $dir/kustomization.yaml" >&2; exit 1; }

"$helm" package "$crds" --destination "$out" >/dev/null
"$helm" package "$root/charts/aether-edge" --destination "$out" >/dev/null
echo "aether-edge-crds-$chart_version.tgz ($n CRDs, Gateway API $bundle_version) and aether-edge-$chart_version.tgz in $out" >&2
echo "$out"
