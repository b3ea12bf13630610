# `make bench`: modeltap side by side with its peers on loopback (benchmarks/README.md).
# Each tool lives in its own venv, created once and refreshed only when its requirements file changes:
#   .venv-bench            the harness, stand-in upstream, load generator, matplotlib, py-spy, and modeltap itself
#                          (with its [otlp] extra, for bench-otlp, and [fast]: uvloop)
#   .venv-bench-mitmproxy  mitmproxy 11.0.2 (the last release for Python 3.11)
#   .venv-bench-litellm    litellm[proxy] 1.108.7, hash-locked (releases 1.82.7/1.82.8 were malicious)
#   .venv-bench-agl        agentlightning 1.0.2 (needs Python >= 3.12); optional: the bench says when it is absent
#   .venv-bench-rllm       rllm-model-gateway 0.1.0, hash-locked: rLLM's model gateway

BENCH_PYTHON ?= python3
# Agent Lightning 1.0 requires Python >= 3.12; this machine has one under pyenv.
BENCH_PYTHON_agl ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) python3.12)
BENCH_PEERS := mitmproxy litellm rllm
BENCH_ARGS ?=

.PHONY: bench bench-trend bench-overhead bench-scale bench-counting bench-otlp bench-token-ids bench-exact bench-profile bench-translation bench-store bench-venvs

bench: bench-venvs
	.venv-bench/bin/python -m benchmarks.bench_overhead $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.trend
	.venv-bench/bin/python -m benchmarks.bench_scale $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_counting $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_otlp $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_translation $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_store $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_token_ids $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.bench_exact $(BENCH_ARGS)

bench-overhead: bench-venvs
	.venv-bench/bin/python -m benchmarks.bench_overhead $(BENCH_ARGS)
	.venv-bench/bin/python -m benchmarks.trend

bench-scale: bench-venvs
	.venv-bench/bin/python -m benchmarks.bench_scale $(BENCH_ARGS)

bench-counting: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_counting $(BENCH_ARGS)

# modeltap alone, a translated stream against an untranslated one: no peer venvs needed.
bench-translation: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_translation $(BENCH_ARGS)

bench-otlp: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_otlp $(BENCH_ARGS)

# The store alone needs no peer: it fills one records database to 1M exchanges (about 2 GB in $TMPDIR).
bench-store: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_store $(BENCH_ARGS)

bench-token-ids: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_token_ids $(BENCH_ARGS)

# serve --tokens exact against --tokens observe, per turn at 2k and 60k tokens of history.
bench-exact: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_exact $(BENCH_ARGS)

# The trend table from the kept release runs and the latest overhead run (benchmarks/trend.py).
bench-trend: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.trend

bench-profile: .venv-bench/.installed
	.venv-bench/bin/python -m benchmarks.bench_profile $(BENCH_ARGS)

bench-venvs: .venv-bench/.installed $(BENCH_PEERS:%=.venv-bench-%/.installed)
	@$(MAKE) --no-print-directory .venv-bench-agl/.installed \
		|| echo "bench: Agent Lightning did not install; its rows will say so"

.venv-bench/.installed: requirements/bench.txt pyproject.toml
	test -x .venv-bench/bin/python || $(BENCH_PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install --quiet -r requirements/bench.txt -e '.[budget,fast,otlp]'
	touch $@

# The peers install from full hash locks with --no-deps, so pip takes exactly the files recorded there.
.venv-bench-%/.installed: requirements/bench-%.txt
	test -x .venv-bench-$*/bin/python || $(or $(BENCH_PYTHON_$*),$(BENCH_PYTHON)) -m venv .venv-bench-$*
	.venv-bench-$*/bin/pip install --quiet --require-hashes --no-deps -r requirements/bench-$*.txt
	touch $@
