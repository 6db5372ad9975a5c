# Everything installs from this repository's own files into .venv (pip's cache makes re-runs fast).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup native demo test lint jaeger jaeger-up otelcol seaweedfs browser bench-conversion bench-collector bench-analyze bench-analyze-scale clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# xsp's native capture core (xsp/tracer/native/capture.cpp), built against the installed torch with
# its C++ headers (and CUPTI's, on a CUDA build), once per torch version, in ~/.cache/xsp/native.
native: $(STAMP)
	$(VENV)/bin/xsp native

# A real leveled profile (levels M, MF and MFL) of the embedded default model on CPU, then its
# reconstruction, analyses and HTML report.
demo: native
	$(VENV)/bin/xsp run --model torchvision:resnet18 --batch-size 2 --iterations 3 --levels M,MF,MFL --device cpu --out xsp-runs/demo --replace
	$(VENV)/bin/xsp analyze xsp-runs/demo --rows 8 --report xsp-runs/demo/report.html

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The real-Jaeger end-to-end tests need Jaeger's binary (built once from the Go module proxy) and
# its web UI (built once with npm from source), both cached in ~/.cache/xsp; without Go or npm
# they are skipped, except under CI, where they must run.
jaeger:
	-scripts/build-jaeger.sh

# Jaeger with its UI on loopback (http://127.0.0.1:16686, OTLP on 4317/4318) until Ctrl-C; its
# traces are kept in xsp-jaeger/ (Badger), so a restart still shows them.
jaeger-up:
	bin=$$(scripts/build-jaeger.sh) && JAEGER_UI_ASSETS=$$(dirname "$$bin")/ui \
	  JAEGER_BADGER_DIR=$(CURDIR)/xsp-jaeger \
	  JAEGER_OTLP_GRPC=127.0.0.1:4317 JAEGER_OTLP_HTTP=127.0.0.1:4318 \
	  JAEGER_QUERY_HTTP=127.0.0.1:16686 JAEGER_QUERY_GRPC=127.0.0.1:16685 \
	  JAEGER_HEALTH=127.0.0.1:13133 "$$bin" --config deploy/jaeger.yaml

# The OpenTelemetry Collector gateway in front of collector replicas (deploy/otelcol-gateway.yaml),
# built once with the OpenTelemetry Collector Builder from the Go module proxy into ~/.cache/xsp;
# without Go its test is skipped, except under CI, where it must run.
otelcol:
	-scripts/build-otelcol.sh

# The object-store tests talk to a real S3 server: SeaweedFS's S3 gateway, built once from the Go
# module proxy and cached in ~/.cache/xsp; without Go they are skipped, except under CI.
seaweedfs:
	-scripts/build-seaweedfs.sh >/dev/null

# The browser tests look at the report and Jaeger's UI in headless Chromium, Debian's package.
browser:
	-@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

test: lint native jaeger otelcol seaweedfs browser
	$(PY) -m pytest --cov --cov-report=term:skip-covered

bench-conversion: $(STAMP)
	$(PY) benchmarks/conversion.py

bench-collector: $(STAMP)
	$(PY) benchmarks/collector_load.py

bench-analyze: $(STAMP)
	$(PY) benchmarks/analyze.py

bench-analyze-scale: $(STAMP)
	$(PY) benchmarks/analyze_scale.py

clean:
	rm -rf $(VENV) xsp-runs .pytest_cache .mypy_cache .ruff_cache .coverage
