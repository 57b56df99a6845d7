#!/bin/bash
# The container's HEALTHCHECK: GET /healthz on the admin port named by
# DROVER_ADMIN_LISTEN (a wildcard host is reached on loopback), with bash's
# /dev/tcp because the slim image has no HTTP client. Exit 0 on a 200, or
# on the 400 an admin port serving TLS (tls_cert) gives plain HTTP, which
# says "this admin port speaks TLS": bash speaks no TLS, and that answer
# shows the process up and serving.
set -eu
address=${DROVER_ADMIN_LISTEN:-127.0.0.1:9070}
host=${address%:*}
port=${address##*:}
host=${host#[}
host=${host%]}
case "$host" in 0.0.0.0 | :: | "") host=127.0.0.1 ;; esac
exec 3<>"/dev/tcp/$host/$port"
printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&3
read -r -t 2 _ status _ <&3
[ "$status" = 200 ] && exit 0
[ "$status" = 400 ] && timeout 2 grep -q "speaks TLS" <&3
