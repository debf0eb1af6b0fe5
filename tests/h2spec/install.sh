#!/usr/bin/env bash
# h2spec, the HTTP/2 conformance suite (RFC 7540/9113 and HPACK), built from the Go
# module proxy into target/tools/ once; prints the binary's path. The tests
# (tests/standalone/h2spec.rs) run it against an HTTPS and an h2c listener.
#
# Pinned: `@latest` resolves to this version today (the repository's later tags have a
# go.mod without the /v2 suffix, so the module proxy can't serve them).
#
# Exit 3: no Go toolchain (the test then skips, or fails under AETHER_REQUIRE_K8S=1,
# which CI sets). Other failures are errors.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
version="v2.2.1+incompatible"
out="${CARGO_TARGET_DIR:-$root/target}/tools/h2spec-${version%%+*}"
bin="$out/h2spec"

if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "no Go toolchain: cannot build h2spec $version" >&2
    exit 3
  fi
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    echo "building h2spec $version into $out" >&2
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    # From a scratch directory: outside any module, so nothing here is read or changed.
    (cd "$scratch" && GOBIN="$scratch" GOFLAGS=-mod=mod go install "github.com/summerwind/h2spec/cmd/h2spec@$version") >&2
    mv "$scratch/h2spec" "$bin"
  fi
fi
echo "$bin"
