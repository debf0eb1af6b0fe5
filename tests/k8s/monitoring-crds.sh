#!/usr/bin/env bash
# The Prometheus Operator's PodMonitor and ServiceMonitor CRDs, which the chart renders
# when metrics.podMonitor or metrics.serviceMonitor is on; the chart test installs them
# so the real API server validates those objects against the operator's own schema.
# Taken from the `github.com/prometheus-operator/prometheus-operator` Go module (checked
# against the Go checksum database by `go mod download`) and copied into target/k8s/
# once; prints the directory holding the two YAML files.
#
# Exit 3: no Go toolchain and no cached copy (as tests/k8s/crds.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="v0.80.1"
out="${CARGO_TARGET_DIR:-$root/target}/k8s/prometheus-operator-$version"

if [ ! -f "$out/.complete" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "no Go toolchain: cannot download prometheus-operator@$version" >&2
    exit 3
  fi
  mkdir -p "$(dirname "$out")"
  exec 9>"$out.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    dir="$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json \
      "github.com/prometheus-operator/prometheus-operator@$version" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    src="$dir/example/prometheus-operator-crd"
    if [ -z "$dir" ] || [ ! -f "$src/monitoring.coreos.com_podmonitors.yaml" ]; then
      echo "go mod download prometheus-operator@$version gave no $src" >&2
      exit 1
    fi
    rm -rf "$out"
    mkdir -p "$out"
    cp "$src/monitoring.coreos.com_podmonitors.yaml" "$src/monitoring.coreos.com_servicemonitors.yaml" "$out/"
    chmod -R u+w "$out"
    touch "$out/.complete"
  fi
fi
echo "$out"
