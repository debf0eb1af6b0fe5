#!/usr/bin/env bash
# The official Gateway API CRDs the Kubernetes-mode tests install, taken from the
# `sigs.k8s.io/gateway-api` Go module (checked against the Go checksum database by
# `go mod download`), so a clone of this project needs nothing beside it. Copies the
# module's `config/crd/` into target/k8s/ once and prints that copy's root: the CRDs
# are under `<root>/config/crd/standard` and `<root>/config/crd/experimental`.
#
# Exit 3: no Go toolchain and no cached copy (the tests then skip, or fail under
# AETHER_REQUIRE_K8S=1, as with tests/k8s/build.sh). Other failures are errors.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# The version the install guide (docs/kubernetes.md) and tests/e2e name; the chart's CRD patch is
# written against its layout.
version="v1.6.1"
out="${CARGO_TARGET_DIR:-$root/target}/k8s/gateway-api-$version"

if [ ! -f "$out/.complete" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "no Go toolchain: cannot download sigs.k8s.io/gateway-api@$version" >&2
    exit 3
  fi
  mkdir -p "$(dirname "$out")"
  # Parallel test binaries call this at once: one copies, the others wait and reuse.
  exec 9>"$out.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    # Outside any module (a scratch directory), so no go.mod of this project is read
    # or changed; -mod=mod in case GOFLAGS says otherwise.
    dir="$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@$version" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    if [ -z "$dir" ] || [ ! -d "$dir/config/crd/standard" ]; then
      echo "go mod download sigs.k8s.io/gateway-api@$version gave no config/crd/ (dir: '$dir')" >&2
      exit 1
    fi
    # A writable copy: the module cache is read-only, which `cargo clean` can't remove.
    rm -rf "$out"
    mkdir -p "$out/config"
    cp -r "$dir/config/crd" "$out/config/crd"
    chmod -R u+w "$out"
    touch "$out/.complete"
  fi
fi
echo "$out"
