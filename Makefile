# Everything installs from this repository's own files into .venv (pip's cache makes re-runs fast).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint jaeger bench-conversion bench-collector bench-analyze clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# A real leveled profile (levels M, MF and MFL) of the embedded default model on CPU, then its
# reconstruction, analyses and HTML report.
demo: $(STAMP)
	$(VENV)/bin/xsp run --model torchvision:resnet18 --batch-size 2 --iterations 3 --levels M,MF,MFL --device cpu --out xsp-runs/demo
	$(VENV)/bin/xsp analyze xsp-runs/demo --rows 8 --report xsp-runs/demo/report.html

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The real-Jaeger end-to-end test needs Jaeger's binary (built once from the Go module proxy and
# cached); without Go it is skipped, except under CI, where it must run.
jaeger:
	-scripts/build-jaeger.sh

test: lint jaeger
	$(PY) -m pytest --cov --cov-report=term:skip-covered

bench-conversion: $(STAMP)
	$(PY) benchmarks/conversion.py

bench-collector: $(STAMP)
	$(PY) benchmarks/collector_load.py

bench-analyze: $(STAMP)
	$(PY) benchmarks/analyze.py

clean:
	rm -rf $(VENV) xsp-runs .pytest_cache .mypy_cache .ruff_cache .coverage
