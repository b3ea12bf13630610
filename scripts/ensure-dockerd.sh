#!/usr/bin/env bash
# Make sure a Docker daemon answers `docker info`.
#
# - docker / dockerd missing: install Debian's docker.io with apt-get (one `apt-get update` first; root).
# - dockerd not running: start it detached in its own session, logging to $DOCKERD_LOG, and wait
#   until `docker info` answers. When it already answers, this returns at once.
# No image registry is reachable from the test machines: test images are built locally with
# `docker import` by the tiers that need them.
set -euo pipefail

log=${DOCKERD_LOG:-.cache/dockerd.log}
pidfile=/var/run/docker.pid
# dockerd on a fresh machine takes a few seconds to set up its bridge and storage; 60 s leaves room
# for a slow CI disk without hanging forever on a daemon that cannot start.
wait_s=${DOCKERD_WAIT_S:-60}

docker info >/dev/null 2>&1 && exit 0

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    "$(dirname "$0")/apt-install.sh" docker.io
fi

# A daemon that is up but not answering yet (still starting) is waited for, not started twice. The pid
# file is dockerd's own; it is read instead of `pgrep`, which slim Debian images lack.
# A zombie (killed, not yet reaped) still answers `kill -0`: only a live, non-zombie process counts.
alive() { [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat")" != Z ]; }
if ! { [ -f "$pidfile" ] && alive "$(cat "$pidfile")"; }; then
    [ "$(id -u)" = 0 ] || { echo "ensure-dockerd: dockerd is not running and starting it needs root" >&2; exit 1; }
    mkdir -p "$(dirname "$log")"
    echo "ensure-dockerd: starting dockerd (log: $log)"
    setsid dockerd >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq "$wait_s"); do
    docker info >/dev/null 2>&1 && { echo "ensure-dockerd: dockerd is up"; exit 0; }
    sleep 1
done
echo "ensure-dockerd: dockerd did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 30 "$log" >&2 || true
exit 1
