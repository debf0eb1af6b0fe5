#!/usr/bin/env bash
# nginx standing in for aether-edge under side-by-side.sh, to measure nginx's own access
# log the same way as the edge's:
#
#   A_BIN=benches/load/nginx-as-edge.sh A_ENV=NGINX_LOG=on B_ENV=NGINX_LOG=off \
#     SBS_LOAD=h2 benches/load/side-by-side-runs.sh nginx-log
#
# Called as the edge is (`run --manifests DIR --admin 127.0.0.1:PORT --workers 1`): the
# edge's port is the admin port's less one (side-by-side.sh's layout). One nginx
# process (no master), so its PID, the one side-by-side.sh reads CPU time from, is the
# one serving. With SBS_LOAD=h2 it listens for prior-knowledge h2c (nginx 1.22 serves
# h2c and HTTP/1.1 on different ports), else HTTP/1.1. NGINX_LOG=on: one line a
# request to stdout, the edge's fields that nginx has (conf/nginx-edge-log.conf),
# buffered 1 MiB and flushed every 50 ms as the edge's writer does.
set -euo pipefail

dir='' admin=''
while (($#)); do
  case $1 in
    --manifests) dir=$2; shift 2 ;;
    --admin) admin=$2; shift 2 ;;
    *) shift ;;
  esac
done
[[ -n $dir && -n $admin ]] || { echo "nginx-as-edge: needs --manifests and --admin" >&2; exit 2; }
port=$((${admin##*:} - 1))
up_port=$(awk '/port:/ { p = $2 } END { print p }' "$dir/gateway.yaml")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run=$(cd "$dir/.." && pwd)/nginx-edge
mkdir -p "$run/tmp"
http2=''
[[ ${SBS_LOAD:-h2} == h2 ]] && http2=' http2'

log='access_log off;'
if [[ ${NGINX_LOG:-off} == on ]]; then
  log="include $here/conf/nginx-edge-log.conf; access_log /dev/stdout edge buffer=1m flush=50ms;"
fi
{
  printf 'daemon off;\nmaster_process off;\nworker_processes 1;\npid %s/nginx.pid;\n' "$run"
  printf 'error_log %s/error.log warn;\nworker_rlimit_nofile 16384;\n' "$run"
  printf 'events { worker_connections 8192; }\nhttp {\n    %s\n' "$log"
  for t in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s/tmp/%s;\n' "$t" "$run" "$t"; done
  cat <<CONF
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    http2_max_requests 10000000;
    server_tokens off;
    upstream bench_upstream {
        server 127.0.0.1:$up_port;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$port$http2 backlog=4096;
        location / {
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Request-Id \$request_id;
        }
    }
}
CONF
} >"$run/nginx.conf"
exec nginx -c "$run/nginx.conf"
