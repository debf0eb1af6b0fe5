#!/usr/bin/env bash
# Jaeger v2 (cmd/jaeger: the OpenTelemetry collector with OTLP gRPC/HTTP receivers, an
# in-memory trace store and the query HTTP API), built from the Go module proxy into
# target/tools/ once; prints the binary's path. tests/standalone/traces.rs runs it as
# the real OTLP receiver the edge exports its spans to.
#
# Pinned by go.mod/go.sum beside this script (a `tool` directive), so the build is the
# same on every machine: `go build` from this module, with Go's build cache making a
# second build seconds.
#
# Exit 3: no Go toolchain (the test then skips, or fails under AETHER_REQUIRE_K8S=1,
# which CI sets). Other failures are errors.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="v1.76.0"
out="${CARGO_TARGET_DIR:-$root/target}/tools/jaeger-$version"
bin="$out/jaeger"

if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "no Go toolchain: cannot build Jaeger $version" >&2
    exit 3
  fi
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    echo "building Jaeger $version into $out (several minutes on 2 cores, once)" >&2
    (cd "$here" && go build -mod=readonly -trimpath -o "$out/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger) >&2
    mv "$out/jaeger.tmp" "$bin"
  fi
fi
echo "$bin"
