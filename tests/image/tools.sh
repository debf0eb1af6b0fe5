#!/usr/bin/env bash
# What the image test needs: umoci and skopeo (image/build.sh) and runc, the OCI
# runtime it runs the image with, from Debian. Prints runc's path.
#
# Exit 3: a tool is missing and cannot be installed here, or this is not root (runc
# and umoci unpack without rootless mode need root): the test then skips, or fails
# under AETHER_REQUIRE_K8S=1, which CI sets. Other failures are errors.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "not root: runc cannot run the image here" >&2
  exit 3
fi
missing=()
for tool in runc umoci skopeo strip; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "${missing[*]} not installed, and no apt-get to install them" >&2
    exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  packages=(runc umoci skopeo binutils)
  # apt-gets serialised: tests run at once, and dpkg's lock fails the loser.
  if ! flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends "${packages[@]}" >&2; then
    flock /tmp/aether-apt.lock apt-get update -q >&2
    flock /tmp/aether-apt.lock apt-get install -y -q --no-install-recommends "${packages[@]}" >&2
  fi
fi
command -v runc
