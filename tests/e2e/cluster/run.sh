#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, without Docker or a registry,
# inside a network namespace of its own; aether-edge installed by its Helm chart; the
# upstream Gateway API conformance suite run against it. See README.md beside this file.
#
#   tests/e2e/cluster/run.sh build        # build what is missing (cached in target/cluster/)
#   tests/e2e/cluster/run.sh up           # build, start the cluster, install CRDs and the chart
#   tests/e2e/cluster/run.sh e2e          # two Gateways, rolling upgrade under load, dedicated pods (e2e.sh)
#   tests/e2e/cluster/run.sh conformance  # run the upstream suite (cluster must be up)
#   tests/e2e/cluster/run.sh down         # stop everything, remove every trace
#   tests/e2e/cluster/run.sh all          # up, e2e, conformance, down
#   tests/e2e/cluster/run.sh exec CMD...  # run CMD inside the namespace, KUBECONFIG set
#
# Everything runs inside a network namespace this script creates (`unshare --net`): the
# pod (10.244.0.0/24), Service (10.96.0.0/16) and load-balancer (10.97.0.0/24) networks
# and the node address (10.200.0.1 on an empty bridge) exist only there, with no route
# out. Needs root, Go, cargo, and Debian's containerd runc containernetworking-plugins
# iptables conntrack umoci skopeo etcd-server (installed when missing).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
top="$target/cluster"
bin="$top/bin"
images="$top/images"
state="$top/state"
nsdir="$top/netns"
ns="$nsdir/net"
cgname="aether-cluster"
node="aether-node"
node_ip="10.200.0.1"
pod_cidr="10.244.0.0/24"
service_cidr="10.96.0.0/16"
lb_prefix="10.97.0"
profile="${PROFILE:-quick}"
edge_tag="cluster"
gateway_api_version="v1.6.1"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/k8s/go.mod")"

log() { printf '== %s (%ss)\n' "$*" "$SECONDS" >&2; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
inns() { nsenter --net="$ns" "$@"; }
kc() { inns "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" "$@"; }

# wait_for DESC SECONDS CMD...: CMD until it succeeds, at most SECONDS.
wait_for() {
  local desc="$1" limit="$2" deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$desc: not within ${limit}s"
    sleep 0.5
  done
}

# ---------------------------------------------------------------------------- build

packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v crun >/dev/null || missing+=(crun)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v umoci >/dev/null || missing+=(umoci)
  command -v skopeo >/dev/null || missing+=(skopeo)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}") >&2
  fi
}

# mkimage REF ROOTFS USER ENTRYPOINT...: an OCI image of ROOTFS as a docker-archive.
mkimage() {
  local ref="$1" rootfs="$2" user="$3" layout
  shift 3
  layout="$(mktemp -d)/oci"
  local args=()
  for a in "$@"; do args+=(--config.entrypoint "$a"); done
  umoci init --layout "$layout"
  umoci new --image "$layout:img"
  umoci insert --image "$layout:img" "$rootfs" /
  umoci config --image "$layout:img" --os linux --architecture amd64 \
    --config.user "$user" --config.workingdir / "${args[@]}"
  umoci gc --layout "$layout"
  rm -f "$images/$(basename "$rootfs").tar"
  skopeo --insecure-policy copy -q "oci:$layout:img" "docker-archive:$images/$(basename "$rootfs").tar:$ref"
  rm -rf "$(dirname "$layout")"
}

build() {
  packages
  mkdir -p "$bin" "$images"
  local ld
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version
    -X k8s.io/component-base/version.gitMajor=1
    -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$k8s_version")
    -X k8s.io/component-base/version.gitTreeState=clean
    -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
  local comps=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl) need=()
  for c in "${comps[@]}"; do
    [[ -x "$bin/$c" && "$bin/$c" -nt "$here/k8s/go.mod" ]] || need+=("k8s.io/kubernetes/cmd/$c")
  done
  if ((${#need[@]})); then
    log "building ${need[*]##*/} $k8s_version (cold: ~10 min on 2 cores)"
    (cd "$here/k8s" && nice -n 10 go build -trimpath -ldflags "$ld" -o "$bin/" "${need[@]}")
  fi

  local conf_dir=$here/../conformance
  if [[ ! -x "$bin/echo-basic" || "$bin/echo-basic" -ot "$conf_dir/go.mod" ]]; then
    log "building echo-basic from sigs.k8s.io/gateway-api/conformance"
    (cd "$conf_dir" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags '-s -w' \
      -o "$bin/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic)
  fi
  if [[ ! -x "$bin/conformance.test" || "$bin/conformance.test" -ot "$conf_dir/conformance_test.go" ||
    "$bin/conformance.test" -ot "$conf_dir/go.mod" ]]; then
    log "building the conformance suite"
    (cd "$conf_dir" && nice -n 10 go test -c -trimpath -o "$bin/conformance.test" .)
  fi
  local coredns_version
  coredns_version="$(manifest_images | sed -n 's#^registry.k8s.io/coredns/coredns:##p' | head -n1)"
  if [[ ! -x "$bin/coredns-$coredns_version" ]]; then
    log "building CoreDNS $coredns_version"
    local gobin
    gobin="$(mktemp -d)"
    (cd "$gobin" && GOBIN="$gobin" CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 \
      go install -trimpath -ldflags '-s -w' "github.com/coredns/coredns@$coredns_version")
    mv "$gobin/coredns" "$bin/coredns-$coredns_version"
    rm -rf "$gobin"
  fi
  if [[ ! -x "$bin/pause" || "$bin/pause" -ot "$here/pause.c" ]]; then
    gcc -O2 -static -o "$bin/pause" "$here/pause.c"
    strip "$bin/pause"
  fi

  log "building aether-edge (cargo --profile $profile)"
  (cd "$root" && nice -n 10 cargo build -q --profile "$profile" --bin aether-edge)
  local edge="$target/$profile/aether-edge"
  [[ "$profile" == dev ]] && edge="$target/debug/aether-edge"

  # Images: rebuilt when their binary is newer.
  local r
  r="$(mktemp -d)"
  if [[ ! -f "$images/aether-edge.tar" || "$images/aether-edge.tar" -ot "$edge" ]]; then
    log "image aether-edge:$edge_tag (image/build.sh)"
    bash "$root/image/build.sh" "$edge" "$r/aether-edge" "$edge_tag" >/dev/null
    mv "$r/aether-edge.tar" "$images/aether-edge.tar"
  fi
  if [[ ! -f "$images/pause.tar" || "$images/pause.tar" -ot "$bin/pause" ]]; then
    mkdir -p "$r/pause"
    cp "$bin/pause" "$r/pause/pause"
    mkimage aether.local/pause:1 "$r/pause" 65535:65535 /pause
  fi
  if [[ ! -f "$images/echo-basic.tar" || "$images/echo-basic.tar" -ot "$bin/echo-basic" ]]; then
    mkdir -p "$r/echo-basic"
    cp "$bin/echo-basic" "$r/echo-basic/echo-basic"
    mkimage aether.local/echo-basic:1 "$r/echo-basic" 0:0 /echo-basic
  fi
  if [[ ! -f "$images/coredns.tar" || "$images/coredns.tar" -ot "$bin/coredns-$coredns_version" ]]; then
    mkdir -p "$r/coredns"
    cp "$bin/coredns-$coredns_version" "$r/coredns/coredns"
    mkimage "registry.k8s.io/coredns/coredns:$coredns_version" "$r/coredns" 0:0 /coredns
  fi
  rm -rf "$r"

  helm="$(bash "$root/tests/chart/tools.sh")"
  ln -sf "$helm" "$bin/helm"
  # What a user installs: the packaged CRDs chart (the Go module's experimental channel
  # with the GEP-5093 patch) and the edge chart.
  bash "$root/charts/package.sh" "$top/charts" >/dev/null
}

# The images the suite's manifests name (echo-basic under several tags, CoreDNS).
manifest_images() {
  local dir
  dir="$(cd "$here/../conformance" && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)"
  grep -rhoE 'image: *[^ ]+' "$dir/base" "$dir/tests" | awk '{print $2}' | sort -u
}

# ---------------------------------------------------------------------------- up

cgroup_dirs() {
  local c
  for c in /sys/fs/cgroup/*/; do
    [[ -f "$c/cgroup.procs" && ! -L "${c%/}" ]] && printf '%s\n' "${c%/}"
  done
}

# The cgroup every process of the cluster lives in (pods under $cgname/kubepods), so
# teardown finds them all, containerd's shims included.
make_cgroups() {
  local c sub
  for c in $(cgroup_dirs); do
    for sub in "$cgname" "$cgname/system"; do
      mkdir -p "$c/$sub"
      if [[ -f "$c/$sub/cpuset.cpus" && -z "$(cat "$c/$sub/cpuset.cpus")" ]]; then
        cat "$(dirname "$c/$sub")/cpuset.cpus" >"$c/$sub/cpuset.cpus"
        cat "$(dirname "$c/$sub")/cpuset.mems" >"$c/$sub/cpuset.mems"
      fi
    done
  done
}

# start NAME CMD...: CMD inside the namespace and the system cgroup, its pid in state/.
start() {
  local name="$1"
  shift
  # shellcheck disable=SC2016 # expanded by the inner bash
  inns setsid bash -c '
    pidfile="$1"; shift
    for c in /sys/fs/cgroup/*/'"$cgname"'/system; do echo $$ >"$c/cgroup.procs" 2>/dev/null || true; done
    echo $$ >"$pidfile"
    exec "$@"' start "$state/$name.pid" "$@" >"$state/log/$name.log" 2>&1 </dev/null &
  wait_for "$name pid file" 10 test -s "$state/$name.pid"
}

alive() { [[ -s "$state/$1.pid" ]] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

kubeconfig() { # FILE TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$state/pki/ca.crt"}
users:
- name: user
  user: {token: "$2"}
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
EOF
}

certs() {
  local p="$state/pki"
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 7 \
    -subj /CN=aether-cluster-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$p/apiserver.key" -out "$p/apiserver.csr" \
    -subj /CN=kube-apiserver 2>/dev/null
  printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:$node_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    "extendedKeyUsage=serverAuth" >"$p/apiserver.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 7 -out "$p/apiserver.crt" -extfile "$p/apiserver.ext" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  local user tok line=()
  : >"$p/tokens.csv"
  for user in admin kubelet controller-manager scheduler kube-proxy; do
    tok="$(openssl rand -hex 16)"
    case "$user" in
      admin) line=("$tok" admin admin '"system:masters"') ;;
      kubelet) line=("$tok" "system:node:$node" kubelet '"system:nodes"') ;;
      kube-proxy) line=("$tok" system:kube-proxy "$user") ;;
      *) line=("$tok" "system:kube-$user" "$user") ;;
    esac
    (IFS=,; printf '%s\n' "${line[*]}") >>"$p/tokens.csv"
    kubeconfig "$state/$user.kubeconfig" "$tok"
  done
  chmod 600 "$p"/*.key "$p/tokens.csv" "$state"/*.kubeconfig
}

write_configs() {
  mkdir -p "$state/cni/net.d" "$state/containerd" "$state/kubelet"
  cat >"$state/containerd/config.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
[grpc]
  address = "$state/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "aether.local/pause:1"
  # The VM lacks CAP_SYS_RESOURCE: runc cannot set a negative oom_score_adj, and
  # without this every pod fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  # Pod network namespaces under state/ too, so teardown finds every mount there.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$state/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
EOF
  cat >"$state/cni/net.d/10-aether.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "aether-cluster",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$state/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  : >"$state/resolv.conf"
  cat >"$state/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$cgname
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$state/containerd.sock
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
address: $node_ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
resolvConf: $state/resolv.conf
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
maxPods: 110
EOF
  cat >"$state/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $pod_cidr
hostnameOverride: $node
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# A LoadBalancer stand-in: every LoadBalancer Service gets an address of
# $lb_prefix.0/24 in status.loadBalancer.ingress (its spec.loadBalancerIP when that is in
# the range; one outside it is never assigned, as with MetalLB's pools: the suite's
# "unusable address"), which kube-proxy routes inside the namespace. Bounded: 12 h of
# 1 s rounds.
lb_loop() {
  local round next=1 key ip want
  declare -A given=()
  for ((round = 0; round < 43200; round++)); do
    while IFS='|' read -r key want ip; do
      [[ -n "$key" && -z "$ip" ]] || continue
      if [[ "$want" == "$lb_prefix".* ]]; then
        ip="$want"
      elif [[ -n "$want" ]]; then
        continue
      elif [[ -n "${given[$key]:-}" ]]; then
        ip="${given[$key]}"
      else
        ((next < 255)) || continue
        ip="$lb_prefix.$next"
        next=$((next + 1))
      fi
      given[$key]="$ip"
      kc -n "${key%%/*}" patch service "${key#*/}" --subresource=status --type=merge \
        -p "{\"status\":{\"loadBalancer\":{\"ingress\":[{\"ip\":\"$ip\"}]}}}" >/dev/null || true
    done < <(kc get services -A -o jsonpath='{range .items[?(@.spec.type=="LoadBalancer")]}{.metadata.namespace}/{.metadata.name}|{.spec.loadBalancerIP}|{.status.loadBalancer.ingress[0].ip}{"\n"}{end}' 2>/dev/null)
    sleep 1
  done
}

up() {
  # NO_BUILD=1: start from what target/cluster/ has (no Go, cargo or helm steps).
  [[ "${NO_BUILD:-0}" == 1 ]] || build
  [[ -e "$state" ]] && fail "$state exists: run '$0 down' first"
  local t0=$SECONDS
  mkdir -p "$state/log" "$nsdir"
  log "network namespace $ns"
  if ! mountpoint -q "$nsdir"; then
    mount --bind "$nsdir" "$nsdir"
    mount --make-private "$nsdir"
  fi
  touch "$ns"
  unshare --net="$ns" true
  inns ip link set lo up
  inns ip link add aether0 type bridge
  inns ip addr add "$node_ip/24" dev aether0
  inns ip link set aether0 up
  # The empty bridge carries the routes of the Service and load-balancer ranges, so the
  # kernel has a route for them; kube-proxy's DNAT does the rest. No default route.
  inns ip route add "$service_cidr" dev aether0
  inns ip route add "$lb_prefix.0/24" dev aether0
  inns sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  make_cgroups
  certs
  write_configs

  log "etcd"
  mkdir -p "$state/etcd"
  mount -t tmpfs -o size=1g tmpfs "$state/etcd"
  start etcd etcd --name aether --data-dir "$state/etcd/data" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster aether=http://127.0.0.1:2380
  log "kube-apiserver $k8s_version"
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$node_ip" \
    --tls-cert-file="$state/pki/apiserver.crt" --tls-private-key-file="$state/pki/apiserver.key" \
    --client-ca-file="$state/pki/ca.crt" --token-auth-file="$state/pki/tokens.csv" \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --service-cluster-ip-range="$service_cidr" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$state/pki/sa.pub" \
    --service-account-signing-key-file="$state/pki/sa.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname --profiling=false
  wait_for "kube-apiserver /readyz" 90 kc get --raw /readyz
  log "controller-manager, scheduler, containerd"
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$state/controller-manager.kubeconfig" --leader-elect=false \
    --service-account-private-key-file="$state/pki/sa.key" --root-ca-file="$state/pki/ca.crt" \
    --use-service-account-credentials=true --controllers='*,-nodeipam' \
    --bind-address=127.0.0.1 --profiling=false
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$state/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false
  start containerd containerd --config "$state/containerd/config.toml"
  wait_for "containerd socket" 30 test -S "$state/containerd.sock"
  local img
  for img in "$images"/*.tar; do
    [[ -f "$img" ]] || continue
    inns ctr --address "$state/containerd.sock" -n k8s.io images import "$img" >/dev/null
  done
  # The suite's manifests name echo-basic under several tags.
  [[ -f "$images/echo-basic.tar" ]] && while read -r img; do
    case "$img" in
      registry.k8s.io/gateway-api/echo-basic:*)
        inns ctr --address "$state/containerd.sock" -n k8s.io images tag --force \
          aether.local/echo-basic:1 "$img" >/dev/null ;;
    esac
  done < <(manifest_images)
  log "kubelet, kube-proxy"
  start kubelet "$bin/kubelet" --config="$state/kubelet/config.yaml" \
    --kubeconfig="$state/kubelet.kubeconfig" --root-dir="$state/kubelet" \
    --cert-dir="$state/kubelet/pki" --hostname-override="$node" --node-ip="$node_ip"
  start kube-proxy "$bin/kube-proxy" --config="$state/kube-proxy.yaml"
  wait_for "node $node registered" 60 kc get node "$node"
  kc wait --for=condition=Ready "node/$node" --timeout=60s >/dev/null
  log "node Ready: bring-up took $((SECONDS - t0))s"
  local p
  for p in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy; do
    alive "$p" || fail "$p exited: $(tail -n 5 "$state/log/$p.log")"
  done
  start lb-loop bash "$here/run.sh" lb-loop

  local chart_version
  chart_version="$(awk '/^version:/ {print $2; exit}' "$root/charts/aether-edge/Chart.yaml")"
  log "Gateway API CRDs $gateway_api_version: the packaged aether-edge-crds chart (helm)"
  inns "$bin/helm" --kubeconfig "$state/admin.kubeconfig" upgrade --install aether-edge-crds \
    "$top/charts/aether-edge-crds-$chart_version.tgz" >/dev/null
  kc wait --for=condition=Established crd --all --timeout=60s >/dev/null
  log "the packaged aether-edge chart (helm)"
  # UDPRouteWeightedRouting opens 500 flows from one client, and kube-proxy masquerades
  # them all to one source address: past the default cap of 256 flows per source (as
  # in the case runner, docs/conformance.md).
  inns "$bin/helm" --kubeconfig "$state/admin.kubeconfig" upgrade --install aether-edge \
    "$top/charts/aether-edge-$chart_version.tgz" --namespace aether-system --create-namespace \
    --set image.repository=aether-edge --set image.tag="$edge_tag" --set image.pullPolicy=Never \
    --set 'extraArgs={--udp-max-flows-per-source=1024}' \
    --wait --timeout 180s >/dev/null
  kc -n aether-system get pods -o wide
  log "cluster up in $((SECONDS - t0))s; '$0 exec kubectl get pods -A' to look around"
}

# ---------------------------------------------------------------------------- conformance

# The features of docs/conformance.md's table that say "yes": the suite is told exactly
# what the docs claim (TLSRouteModeTerminate among them: left out, the suite would run
# TLSRouteListenerTerminateNotSupported, which expects Terminate refused).
supported_features() {
  awk -F'|' '$3 ~ /^ *yes *$/ {gsub(/[ `]/, "", $2); print $2}' "$root/docs/conformance.md" \
    | paste -sd, -
}

conformance() {
  [[ -f "$state/admin.kubeconfig" ]] || fail "no cluster: run '$0 up' first"
  local out="$root/conformance/reports" version features start
  version="$(awk -F'"' '/^version *=/ {print $2; exit}' "$root/Cargo.toml")"
  features="${SUPPORTED_FEATURES:-$(supported_features)}"
  mkdir -p "$out"
  local report="$out/gateway-api-$gateway_api_version-aether-edge-$version.yaml"
  log "conformance: profiles GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP"
  log "supported features: $features"
  start=$SECONDS
  local rc=0 extra=()
  read -ra extra <<<"${CONFORMANCE_ARGS:-}"
  (cd "$here/../conformance" && inns env KUBECONFIG="$state/admin.kubeconfig" timeout 5400 \
    "$bin/conformance.test" -test.run TestConformance -test.timeout 85m -test.v \
    -gateway-class=aether \
    -conformance-profiles=GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP \
    -supported-features="$features" \
    -organization=aether -project=aether-edge -version="$version" \
    -url=https://github.com/aether-mesh/aether-edge -contact=aether-edge-maintainers \
    -usable-address="$lb_prefix.250" -unusable-address=10.98.0.1 \
    -report-output="$report" "${extra[@]}") 2>&1 | tee "$top/conformance.log" || rc=$?
  log "conformance suite ran $((SECONDS - start))s (exit $rc); log: $top/conformance.log; report: $report"
  return "$rc"
}

# ---------------------------------------------------------------------------- down

# Pids in the cluster's cgroups (the pids hierarchy, or any other one present).
cgroup_pids() {
  local c
  for c in $(cgroup_dirs); do
    [[ -d "$c/$cgname" ]] && find "$c/$cgname" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

stop_pid() { # NAME: SIGTERM, then SIGKILL after 10 s
  local pid
  [[ -s "$state/$1.pid" ]] || return 0
  pid="$(cat "$state/$1.pid")"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  local t0=$SECONDS
  if [[ -d "$state" ]]; then
    log "stopping processes"
    for p in lb-loop kubelet kube-proxy kube-scheduler kube-controller-manager; do stop_pid "$p"; done
    # Containers through containerd first, so each shim exits and removes its socket.
    if alive containerd; then
      local ctr_=(timeout 20 nsenter --net="$ns" ctr --address "$state/containerd.sock" -n k8s.io) id
      for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
        "${ctr_[@]}" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
      done
      for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
        "${ctr_[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true
      done
      for id in $("${ctr_[@]}" containers ls -q 2>/dev/null); do
        "${ctr_[@]}" containers rm "$id" >/dev/null 2>&1 || true
      done
    fi
    # Every pod and containerd shim is in the cluster's cgroups.
    for _ in 1 2 3; do
      local pids
      pids="$(cgroup_pids | grep -vxF -e "$(cat "$state/containerd.pid" 2>/dev/null || echo x)" \
        -e "$(cat "$state/kube-apiserver.pid" 2>/dev/null || echo x)" \
        -e "$(cat "$state/etcd.pid" 2>/dev/null || echo x)" || true)"
      [[ -z "$pids" ]] && break
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
      sleep 0.5
    done
    for p in containerd kube-apiserver etcd; do stop_pid "$p"; done
    if grep -q " $ns " /proc/mounts; then
      log "iptables, bridges"
      if [[ -x "$bin/kube-proxy" ]]; then inns "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
      local table chain
      for table in nat filter mangle; do
        for chain in $(inns iptables-save -t "$table" 2>/dev/null | sed -n 's/^:\(\(CNI\|KUBE\)-[^ ]*\).*/\1/p'); do
          inns iptables -t "$table" -F "$chain" 2>/dev/null || true
        done
        for chain in $(inns iptables-save -t "$table" 2>/dev/null | sed -n 's/^:\(\(CNI\|KUBE\)-[^ ]*\).*/\1/p'); do
          inns iptables -t "$table" -X "$chain" 2>/dev/null || true
        done
      done
      inns ip link del cni0 2>/dev/null || true
      inns ip link del aether0 2>/dev/null || true
    fi
  fi
  log "mounts"
  # Deepest first: pod volumes, containerd's rootfs and sandbox mounts, etcd's tmpfs.
  local m
  for _ in 1 2 3; do
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(awk -v s="$state/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r)
  done
  if grep -q " $ns " /proc/mounts; then umount "$ns"; fi
  if grep -q " $nsdir " /proc/mounts; then umount "$nsdir"; fi
  log "cgroups"
  local c
  for c in $(cgroup_dirs); do
    if [[ -d "$c/$cgname" ]]; then find "$c/$cgname" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
  done
  for c in $(cgroup_dirs); do
    [[ -d "$c/$cgname" ]] && fail "cgroup $c/$cgname is left (pids: $(cgroup_pids | tr '\n' ' '))"
  done
  rm -rf "$state" "$nsdir"
  # containerd's shims keep their sockets in /run/containerd/s/ whatever the state
  # directory; each shim removed its own. Only empty directories go.
  rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  log "down in $((SECONDS - t0))s"
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  conformance) conformance ;;
  e2e) bash "$here/e2e.sh" ;;
  all)
    trap down EXIT
    up
    bash "$here/e2e.sh"
    conformance
    ;;
  exec)
    shift
    export KUBECONFIG="$state/admin.kubeconfig"
    PATH="$bin:$PATH" inns "$@"
    ;;
  lb-loop) lb_loop ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
