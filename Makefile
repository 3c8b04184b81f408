# Set-up is part of every target: a fresh clone runs `make demo` or `make test` and nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlmon demo

# Debian's prometheus and alertmanager for the integration tests (root on CI; skipped quietly when
# they are already there).
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check rlmon tests bench
	$(VENV)/bin/mypy

test: $(STAMP) system-deps lint
	$(PY) -m pytest

bench: $(STAMP)
	for f in bench/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
