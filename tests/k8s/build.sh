#!/usr/bin/env bash
# Builds what the Kubernetes-mode integration tests run against, once per checkout:
# a real kube-apiserver (from the k8s.io/kubernetes Go module, pinned in apiserver/go.mod)
# cached under target/k8s/, and etcd from Debian when it is missing. Prints the
# apiserver's path. The tests (tests/kubernetes/) start etcd and the apiserver themselves
# on loopback, so each test run owns its processes and ports.
#
# Exit 3: no Go toolchain (the tests then skip, saying so). Other failures are errors.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/apiserver/go.mod")"
out="${CARGO_TARGET_DIR:-$root/target}/k8s"
# "-stamped": the version is linked in (below); an earlier unstamped build is not reused.
bin="$out/kube-apiserver-$version-stamped"

mkdir -p "$out"
if ! command -v etcd >/dev/null 2>&1; then
  # Under the lock every test script's apt-get takes: the test binary's tests all
  # call this at once, and concurrent apt-gets fail on dpkg's lock (four tests
  # failed so on a machine without etcd).
  (
    flock 8
    if ! command -v etcd >/dev/null 2>&1; then
      echo "installing etcd-server" >&2
      (apt-get update -q && apt-get install -y -q --no-install-recommends etcd-server) >&2
    fi
  ) 8>/tmp/aether-apt.lock
fi

if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "no Go toolchain: cannot build kube-apiserver $version" >&2
    exit 3
  fi
  echo "building kube-apiserver $version into $bin (first time: several minutes)" >&2
  start=$(date +%s)
  # A lock, so parallel test binaries build it once.
  exec 9>"$out/.build.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    # The version stamped as a release build has it: without it the server reports
    # v0.0.0-master, and Helm refuses charts with a kubeVersion constraint (ours
    # have one), as it would on no real cluster.
    ld="-s -w -X k8s.io/component-base/version.gitVersion=$version
      -X k8s.io/component-base/version.gitMajor=1
      -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$version")
      -X k8s.io/component-base/version.gitTreeState=clean"
    (cd "$here/apiserver" && go build -trimpath -ldflags="$ld" -o "$bin.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
    mv "$bin.tmp" "$bin"
    echo "built kube-apiserver in $(( $(date +%s) - start ))s" >&2
  fi
fi
echo "$bin"
