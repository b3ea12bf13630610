# Set-up for the tests and the demo. Each step is idempotent, and instant once done (stamp files):
#   venv     .venv with `pip install -e '.[test]'`; redone when pyproject.toml changes
#   agents   opencode, Claude Code, Codex CLI and Qwen Code from npm into $(NPM_PREFIX), and
#            mini-swe-agent from PyPI into its own venv $(MINI_VENV) (versions: docs/agents.md §1)
#   dockerd  docker.io from apt when missing, dockerd started when not answering (checked every time)
#   chromium Debian's chromium, for the web viewer's browser tests (checked every time)
#   zsh      Debian's zsh, for the completion tests (bash is there already; checked every time)

NPM_PREFIX := .cache/npm
OPENCODE_VERSION := 1.18.33
CLAUDE_CODE_VERSION := 2.1.332
CODEX_VERSION := 0.169.0
QWEN_CODE_VERSION := 0.24.4
# mini-swe-agent pins litellm and openai versions of its own, so it lives in a venv of its own; the
# pins are in requirements/mini-swe-agent.txt (litellm held at the measured 1.110.2: docs/agents.md §8.1).
MINI_VENV := .venv-mini
MINI_STAMP := $(MINI_VENV)/.modeltap-installed

# The stamps live inside what they describe, so deleting .venv or .cache/npm also forgets the stamp;
# the agent stamp names the versions, so changing a pin reinstalls.
VENV_STAMP := $(VENV)/.modeltap-installed
AGENTS_STAMP := $(NPM_PREFIX)/.installed-opencode-$(OPENCODE_VERSION)-claude-code-$(CLAUDE_CODE_VERSION)-codex-$(CODEX_VERSION)-qwen-code-$(QWEN_CODE_VERSION)

.PHONY: setup venv agents dockerd chromium zsh

setup: venv agents dockerd chromium zsh

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

agents: $(AGENTS_STAMP) $(MINI_STAMP)

$(AGENTS_STAMP):
	scripts/install-agents.sh $(NPM_PREFIX) opencode-ai@$(OPENCODE_VERSION) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
	    @openai/codex@$(CODEX_VERSION) @qwen-code/qwen-code@$(QWEN_CODE_VERSION)
	touch $@

$(MINI_STAMP): requirements/mini-swe-agent.txt
	test -x $(MINI_VENV)/bin/python || $(PYTHON) -m venv $(MINI_VENV)
	$(MINI_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/mini-swe-agent.txt
	touch $@

dockerd:
	scripts/ensure-dockerd.sh

chromium:
	command -v chromium >/dev/null || scripts/apt-install.sh chromium

zsh:
	command -v zsh >/dev/null || scripts/apt-install.sh zsh
