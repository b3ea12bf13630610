#!/usr/bin/env bash
# Install the agent CLIs the tests drive (opencode, Claude Code, Codex CLI, Qwen Code) from npm into a
# project-local prefix.
#
# Usage: scripts/install-agents.sh PREFIX PACKAGE@VERSION...
#
# Each ships its native binary (or its whole bundle) inside registry packages, so nothing is fetched
# from outside the npm registry (docs/agents.md §3.1, §4.1, §6.1, §7.1). opencode's postinstall runs
# `opencode --version` with $HOME and leaves folders there, so the install runs with a scratch HOME;
# the user's npm cache and npmrc are passed explicitly so that scratch HOME changes nothing else.
# Afterwards each binary installed is run once (offline, scratch HOME) to prove it starts. `make demo`
# installs opencode alone; `make agents` all four.
set -euo pipefail

prefix=$1
shift
command -v npm >/dev/null || { echo "install-agents: npm not found; install Node.js 20 and npm" >&2; exit 1; }

real_cache=$(npm config get cache)
real_userconfig=$(npm config get userconfig)
scratch_home=$(mktemp -d -t modeltap-npm-home.XXXXXX)
trap 'rm -rf "$scratch_home"' EXIT

mkdir -p "$prefix"
userconfig_args=()
[ -f "$real_userconfig" ] && userconfig_args=(--userconfig "$real_userconfig")
HOME=$scratch_home npm install --prefix "$prefix" --cache "$real_cache" "${userconfig_args[@]}" \
    --save-exact --no-audit --no-fund --no-update-notifier --loglevel=error "$@"

# Smoke run: offline flags from docs/agents.md §3.2, §4.1, §6.2, §7.2 so that no binary reaches for the
# network. CODEX_HOME must exist (§6.2).
mkdir -p "$scratch_home/.codex"
bins=()
for package in "$@"; do
    case ${package%@*} in
        opencode-ai) bins+=(opencode) ;;
        @anthropic-ai/claude-code) bins+=(claude) ;;
        @openai/codex) bins+=(codex) ;;
        @qwen-code/qwen-code) bins+=(qwen) ;;
        *) echo "install-agents: no smoke run known for $package" >&2; exit 1 ;;
    esac
done
for bin in "${bins[@]}"; do
    version=$(HOME=$scratch_home XDG_CONFIG_HOME=$scratch_home/.config XDG_DATA_HOME=$scratch_home/.local/share \
        XDG_CACHE_HOME=$scratch_home/.cache XDG_STATE_HOME=$scratch_home/.local/state \
        CLAUDE_CONFIG_DIR=$scratch_home/.claude CODEX_HOME=$scratch_home/.codex npm_config_offline=true \
        QWEN_USAGE_STATISTICS_ENABLED=0 \
        OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
        "$prefix/node_modules/.bin/$bin" --version </dev/null)
    echo "install-agents: $bin $version"
done
