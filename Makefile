# Two entry points: `make demo` and `make test`. Both create .venv on first use. (`make bench`: the benchmarks.)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
BENCH_STAMP := $(VENV)/.bench-installed-$(shell sha256sum pyproject.toml | cut -c1-16)

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/digits.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

# The [bench] extra adds Lightning for the side-by-side rows; without it those rows are left out.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,bench]" && rm -f $(VENV)/.bench-installed-* && touch $(BENCH_STAMP) \
		|| echo "could not install the [bench] extra (Lightning): benchmarking without it"

# Every benchmark, one after another; rewrites docs/benchmarks.md and docs/img/bench_*.png (<= 15 min on 2 cores).
bench: $(BENCH_STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
