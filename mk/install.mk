# Set-up for the tests and the demo. Each step is idempotent, and instant once done (stamp files):
#   venv     .venv with `pip install -e '.[test]'`; redone when pyproject.toml changes
#   demo-venv  .venv with only what `modeltap demo` uses: `pip install -e '.[demo]'` (the openai SDK);
#            nothing more when the test venv is already there
#   demo-agents  opencode alone from npm into $(NPM_PREFIX): the one agent CLI the demo drives
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

DEMO_STAMP := $(VENV)/.modeltap-demo-installed
OPENCODE_STAMP := $(NPM_PREFIX)/.installed-opencode-$(OPENCODE_VERSION)

.PHONY: setup venv demo-venv agents demo-agents dockerd chromium zsh

setup: venv agents dockerd chromium zsh

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

demo-venv: $(DEMO_STAMP)

# The test extra holds the demo's: a venv `make venv` made (and kept up to date) serves the demo as it is.
$(DEMO_STAMP): pyproject.toml
	if [ -f $(VENV_STAMP) ] && [ $(VENV_STAMP) -nt pyproject.toml ]; then :; else \
	    $(PYTHON) -m venv $(VENV) && \
	    $(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[demo]'; fi
	touch $@

agents: $(AGENTS_STAMP) $(MINI_STAMP)

$(AGENTS_STAMP):
	scripts/install-agents.sh $(NPM_PREFIX) opencode-ai@$(OPENCODE_VERSION) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
	    @openai/codex@$(CODEX_VERSION) @qwen-code/qwen-code@$(QWEN_CODE_VERSION)
	touch $@

demo-agents: $(OPENCODE_STAMP)

$(OPENCODE_STAMP):
	if [ -f $(AGENTS_STAMP) ]; then :; else scripts/install-agents.sh $(NPM_PREFIX) opencode-ai@$(OPENCODE_VERSION); fi
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
