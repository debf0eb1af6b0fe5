#!/usr/bin/env bash
# promtool, Prometheus' own linter for the text exposition format, from Debian's
# `prometheus` package; prints the binary's path. tests/standalone/metrics_lint.rs runs
# `promtool check metrics` on /metrics of a running edge.
#
# Exit 3: promtool is missing and cannot be installed here (not root, or no apt-get):
# the test then skips, or fails under AETHER_REQUIRE_K8S=1, which CI sets. Other
# failures are errors.
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "promtool is not installed, and apt-get cannot install it here" >&2
    exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Only the package's own files: the Prometheus server's dependencies (node exporter,
  # web assets) are recommends. In a container policy-rc.d keeps its service stopped.
  # apt-gets serialised: tests run at once, and dpkg's lock fails the loser.
  if ! flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends prometheus >&2; then
    flock /tmp/aether-apt.lock apt-get update -q >&2
    flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends prometheus >&2
  fi
fi
command -v promtool
