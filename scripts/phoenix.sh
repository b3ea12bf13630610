#!/usr/bin/env bash
# Arize Phoenix, the real OTLP tracing backend for the span-export tests, in its own venv.
#
#   scripts/phoenix.sh install           venv $PHOENIX_VENV (default .venv-phoenix) from requirements/phoenix.txt;
#                                        idempotent: a stamp named after the lock's sha256, so editing the lock
#                                        rebuilds the venv from scratch
#   scripts/phoenix.sh start DIR PORT    start `phoenix serve` offline on 127.0.0.1:PORT with DIR as its working
#                                        directory (SQLite db, pid file, log DIR/phoenix.log), wait until
#                                        /healthz answers, print its PID on stdout (the only thing on stdout)
#   scripts/phoenix.sh stop PID          SIGTERM (uvicorn shuts down gracefully, 0.3-2 s; SIGINT works too but
#                                        takes 2-8 s), wait up to 30 s, then SIGKILL
#   scripts/phoenix.sh env DIR PORT      print the environment `start` uses (KEY=VALUE lines), for a caller that
#                                        starts `$PHOENIX_VENV/bin/phoenix serve` itself (e.g. a pytest fixture)
#
# Its own venv because arize-phoenix 20.26.1 requires anthropic<2 and the test extra pins anthropic==2.14.0.
# OTLP/HTTP: http://127.0.0.1:PORT/v1/traces. gRPC: Phoenix always binds one on [::] (all interfaces, it ignores
# PHOENIX_HOST); PHOENIX_GRPC_PORT=0 (the default here) makes it an ephemeral port, so runs never clash on 4317.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/phoenix.txt"
VENV="${PHOENIX_VENV:-$ROOT/.venv-phoenix}"
PYTHON="${PHOENIX_PYTHON:-python3.11}"
READY_TIMEOUT="${PHOENIX_READY_TIMEOUT:-120}"

die() { echo "phoenix.sh: $*" >&2; exit 1; }

install() {
    local sum stamp
    sum="$(sha256sum "$LOCK" | cut -c1-16)"
    stamp="$VENV/.phoenix-installed-$sum"
    [[ -f "$stamp" ]] && return 0
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PHOENIX_PYTHON to a CPython 3.11-3.14)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # This machine's pip config names two file:// indexes that may be absent: drop pip's per-package warning.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$LOCK" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
    touch "$stamp"
}

# The environment for an offline, loopback-only Phoenix whose every file lives under DIR.
phoenix_env() {
    local dir="$1" port="$2"
    cat <<EOF
PHOENIX_WORKING_DIR=$dir
PHOENIX_HOST=127.0.0.1
PHOENIX_PORT=$port
PHOENIX_GRPC_PORT=${PHOENIX_GRPC_PORT:-0}
PHOENIX_ALLOW_EXTERNAL_RESOURCES=false
PHOENIX_TELEMETRY_ENABLED=false
PHOENIX_DISABLE_AGENT_ASSISTANT=true
PHOENIX_ALLOWED_SANDBOX_PROVIDERS=NONE
PHOENIX_ENABLE_MCP_SERVER=false
PHOENIX_LOG_MIGRATIONS=false
TMPDIR=$dir/tmp
EOF
}

start() {
    local dir port pid deadline
    [[ $# -eq 2 ]] || die "usage: phoenix.sh start DIR PORT"
    [[ "$2" =~ ^[0-9]+$ ]] || die "PORT must be a number: $2"
    [[ -x "$VENV/bin/phoenix" ]] || die "no $VENV/bin/phoenix: run 'scripts/phoenix.sh install' first"
    # Fail now if PORT is taken: else another server's /healthz could pass for this one's.
    "$VENV/bin/python" -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1]))).close()' "$2" \
        2>/dev/null || die "127.0.0.1:$2 is already in use"
    mkdir -p "$1/tmp"
    dir="$(cd "$1" && pwd)"
    port="$2"
    (
        # Drop anything that would point Phoenix's own OTel settings elsewhere.
        unset PHOENIX_COLLECTOR_ENDPOINT OTEL_EXPORTER_OTLP_ENDPOINT PHOENIX_SQL_DATABASE_URL
        while IFS= read -r kv; do export "${kv?}"; done < <(phoenix_env "$dir" "$port")
        exec "$VENV/bin/phoenix" serve </dev/null >>"$dir/phoenix.log" 2>&1
    ) &
    pid=$!
    deadline=$((SECONDS + READY_TIMEOUT))
    until "$VENV/bin/python" - "$port" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=2).read()
EOF
    do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$dir/phoenix.log" >&2
            die "phoenix exited before answering /healthz (log: $dir/phoenix.log)"
        fi
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            tail -n 30 "$dir/phoenix.log" >&2
            die "phoenix did not answer /healthz within ${READY_TIMEOUT}s (log: $dir/phoenix.log)"
        fi
        sleep 0.2
    done
    echo "$pid"
}

stop() {
    local pid="${1:?usage: phoenix.sh stop PID}" i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    echo "phoenix.sh: $pid still running 30 s after SIGTERM; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

cmd="${1:-}"
shift || true
case "$cmd" in
    install) install ;;
    start) start "$@" ;;
    stop) stop "$@" ;;
    env)
        [[ $# -eq 2 ]] || die "usage: phoenix.sh env DIR PORT"
        phoenix_env "$1" "$2"
        ;;
    *) die "usage: phoenix.sh install | start DIR PORT | stop PID | env DIR PORT" ;;
esac
