# shellcheck shell=bash
# Sourced once by benchmarks/device.sh (the GPU machine's presets): the wheels the GPU image lacks,
# the project on the path, bytecode compiled first (as an installed package has it; the image sets
# PYTHONDONTWRITEBYTECODE), the native core built; then helpers for the GPU tests and for one
# overhead.py case written to $OUT/overhead-NAME.json.
# With XSP_BENCH_LOCAL=1 (device.sh --local) it installs and builds nothing: the python3 on PATH
# runs the project from this checkout.
set -u
if [ "${XSP_BENCH_LOCAL:-0}" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${XSP_BENCH_LOCAL:-0}" != 1 ]; then
  python3 -m compileall -q -j 0 xsp/ benchmarks/ /tmp/site >/dev/null 2>&1
  python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
fi

gpu_tests() {  # seconds
  timeout "$1" python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_gpu.py \
    tests/test_native.py::test_gpu_kernel_counts_equal_cuptis_own 2>&1 \
    | grep -E "^E |assert|passed|failed|Error" | head -20
}

overhead() {  # seconds, name, overhead.py arguments...
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 benchmarks/overhead.py --out "$OUT/overhead-$name.json" "$@" 2>&1 | grep -v round
}
