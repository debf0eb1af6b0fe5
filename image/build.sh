#!/usr/bin/env bash
# Builds the edge's OCI image from a built binary, pulling nothing: the stripped
# binary, the C libraries it links (from this machine), CA certificates and a passwd
# entry for the non-root user 65532, on an otherwise empty root filesystem (no shell,
# no package manager): the layout of the Dockerfile's distroless image.
#
#   image/build.sh BIN OUT [TAG]
#
# Writes an OCI image layout to OUT (tag TAG, default: the binary's version) and the
# same image as OUT.tar, a docker-archive that `docker load` and containerd's
# `ctr -n k8s.io images import` take. Prints the layout's path. Needs umoci and
# skopeo (Debian: `apt-get install umoci skopeo`) and binutils' strip.
set -euo pipefail
bin=$(realpath "${1:?usage: image/build.sh BIN OUT [TAG]}")
out=${2:?usage: image/build.sh BIN OUT [TAG]}
tag=${3:-$("$bin" --version 2>/dev/null | awk '{print $2}')}
tag=${tag:-latest}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
commit=$(git -C "$here/.." rev-parse HEAD 2>/dev/null || echo unknown)

for tool in umoci skopeo strip ldd; do
  command -v "$tool" >/dev/null || { echo "image/build.sh: $tool is not installed" >&2; exit 3; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
strip -o "$root/usr/local/bin/aether-edge" "$bin"
# The shared libraries the binary links, and the dynamic loader, at the paths the
# binary asks for (copied from their real files, not as symlinks).
ldd "$bin" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# rustls-native-certs reads the system bundle for `WellKnownCACertificates: System`.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
mkdir -p "$root/home/nonroot"
chown 65532:65532 "$root/home/nonroot" 2>/dev/null || true

rm -rf "$out" "$out.tar"
umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci insert --image "$out:$tag" "$root" /
umoci config --image "$out:$tag" \
  --os linux --architecture "$(go env GOARCH 2>/dev/null || dpkg --print-architecture)" \
  --config.user 65532:65532 --config.workingdir / \
  --config.entrypoint /usr/local/bin/aether-edge --config.cmd run --config.cmd --kubernetes \
  --config.exposedports 9901/tcp \
  --config.label "org.opencontainers.image.title=aether-edge" \
  --config.label "org.opencontainers.image.revision=$commit"
umoci gc --layout "$out"
skopeo --insecure-policy copy -q "oci:$out:$tag" "docker-archive:$out.tar:aether-edge:$tag"
echo "$out"
