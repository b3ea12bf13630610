#!/usr/bin/env bash
# Install Debian packages with apt-get (root): one `apt-get update`, then the packages without their
# recommends. Used by the set-up targets for what pip and npm cannot bring (docker.io, chromium).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "apt-install: installing $* needs root" >&2; exit 1; }
echo "apt-install: installing $* with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "$@" >/dev/null
