#!/usr/bin/env bash
# GPU job for the hardware-counter level (issue 15), on the H200 with Nsight Compute on PATH.
#
#   benchmarks/device_run_counters.sh probe calibrate   # ~3 min: metrics, passes, calibration
#   benchmarks/device_run_counters.sh measure           # ~6 min: ResNet-50 b64 training
#   benchmarks/device_run_counters.sh all               # the three (may pass 10 minutes)
#
# probe:     ncu's version and the metrics the GPU offers (--query-metrics) into $OUT, the metrics
#            xsp picks from them, and one tiny kernel profiled with the whole set (and the lean
#            one: its replay passes); if ncu refuses the set, every metric is tried alone and the
#            bad ones are named (the job goes on).
# calibrate: benchmarks/counter_calibration.py: GEMMs of known shape (fp32, tf32, bf16, fp16)
#            and a 2 GiB copy kernel under ncu against 2*M*N*K and the bytes moved.
# measure:   xsp run of ResNet-50 b64 training at M, MF, MFLG and the counter run MH (one
#            iteration under ncu), timed; its analyses as JSON and HTML; the store as a tarball
#            (benchmarks/data/r50-b64-train-counters), ncu's report apart.
# Assumes the wheels are installed and PYTHONPATH=$PWD:/tmp/site (the device preamble).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${*:-all}
[ "$STAGES" = all ] && STAGES="probe calibrate measure"
NCU=${XSP_NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
echo "ncu: $NCU"; "$NCU" --version 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

probe() {
    "$NCU" --query-metrics > "$OUT/ncu-query-metrics.txt" 2>&1
    "$NCU" --query-metrics --chip gh100 > "$OUT/ncu-query-metrics-gh100.txt" 2>&1
    echo "query-metrics: $(wc -l < "$OUT/ncu-query-metrics.txt") lines"
    python3 - "$OUT/ncu-metric-selection.json" <<'PY'
import json, sys
from xsp.tracer.convert import ncu as counters
from xsp.tracer.run import ncu
tool = ncu.find()
offered = ncu.available_metrics(tool)
chosen, missing = counters.requested_metrics(offered)
first, _ = counters.requested_metrics(None)
report = {"tool": tool, "version": ncu.version(tool), "device_list_read": offered is not None,
          "offered": len(offered or ()), "chosen": chosen, "quantities_without_metric": missing,
          "first_choices_not_offered": [m for m in first if offered and m.split(".")[0] not in offered]}
json.dump(report, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: v for k, v in report.items() if k != "chosen"}, indent=1))
print("chosen:", ",".join(chosen))
PY
    METRICS=$(python3 -c 'from xsp.tracer.run import ncu; print(",".join(ncu.selection(ncu.find())[0]))')
    TINY='import torch; torch.cuda.profiler.start(); (torch.ones(1 << 20, device="cuda") * 2).sum(); torch.cuda.synchronize(); torch.cuda.profiler.stop()'
    if "$NCU" --target-processes all --clock-control none --profile-from-start off --metrics "$METRICS" \
        --csv --page raw --print-units base python3 -c "$TINY" > "$OUT/ncu-tiny.csv" 2> "$OUT/ncu-tiny.err"; then
        echo "the whole metric set profiles: $(grep -c '^"[0-9]' "$OUT/ncu-tiny.csv") kernels"
        grep -h "passes" "$OUT/ncu-tiny.csv" "$OUT/ncu-tiny.err" | head -3
        LEAN=$(XSP_COUNTER_METRICS=lean python3 -c 'from xsp.tracer.run import ncu; print(",".join(ncu.selection(ncu.find())[0]))')
        echo "lean set (XSP_COUNTER_METRICS=lean):"
        "$NCU" --profile-from-start off --metrics "$LEAN" python3 -c "$TINY" 2>&1 | grep passes | head -3
    else
        echo "ncu refused the set: $(grep -h ERROR "$OUT/ncu-tiny.csv" "$OUT/ncu-tiny.err" | head -3)"
        for m in ${METRICS//,/ }; do
            if ! "$NCU" --profile-from-start off --metrics "$m" python3 -c "$TINY" > /dev/null 2>&1; then
                echo "bad metric: $m" | tee -a "$OUT/ncu-bad-metrics.txt"
            fi
        done
    fi
}

calibrate() {
    local start=$SECONDS
    python3 benchmarks/counter_calibration.py --out /tmp/calibration 2>&1 | tail -12
    echo "calibration: $((SECONDS - start)) s"
    mkdir -p "$OUT/calibration"
    cp /tmp/calibration/counter-calibration.json /tmp/calibration/calibration-raw.csv \
        /tmp/calibration/ncu.log "$OUT/calibration/" 2>/dev/null
}

measure() {
    local start=$SECONDS
    rm -rf /tmp/r50c
    python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train \
        --levels M,MF,MFLG,MH --iterations 10 --warmup 3 --device cuda --out /tmp/r50c 2>&1 | tail -14
    echo "xsp run (4 level sets): $((SECONDS - start)) s"
    python3 - /tmp/r50c <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
for run in m["runs"]:
    print(run["levels"], run["status"], run.get("seconds"), run.get("counters") or "", run.get("status_reasons") or "")
mh = json.load(open(sys.argv[1] + "/MH/run.json"))
c = mh.get("counters", {})
print("counter run:", {k: c.get(k) for k in ("kernels", "kernels_per_iteration", "passes", "iterations_from_nvtx",
      "kernels_outside_iterations", "unreadable_cells", "quantities_without_metric", "import_s", "calibration_s", "errors")})
print("peaks measured:", {k: round(v / 1e12, 1) for k, v in (c.get("peaks_measured") or {}).items()})
PY
    python3 -m xsp analyze /tmp/r50c --json > "$OUT/r50c-analyze.json" 2> "$OUT/r50c-analyze.err"
    python3 -m xsp analyze /tmp/r50c --rows 5 --report "$OUT/r50c-report.html" 2>&1 | grep -A40 "matched to the G run" | head -60
    python3 - "$OUT/r50c-analyze.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["analyses"]
print("counter_matching", a.get("counter_matching", {}).get("rows"))
print("model_metrics", a.get("model_metrics", {}).get("rows"))
print("hardware_counters", a.get("hardware_counters"))
PY
    mkdir -p /tmp/ncu-reports && mv /tmp/r50c/MH/counters.ncu-rep /tmp/ncu-reports/ 2>/dev/null
    cp /tmp/r50c/MH/ncu.log "$OUT/r50c-ncu.log" 2>/dev/null
    mv /tmp/r50c /tmp/r50-b64-train-counters
    tar -C /tmp -czf "$OUT/r50-b64-train-counters.tgz" r50-b64-train-counters
    tar -C /tmp -czf "$OUT/r50c-ncu-report.tgz" ncu-reports
    mv /tmp/r50-b64-train-counters /tmp/r50c
}

for stage in $STAGES; do
    echo "=== $stage"
    "$stage"
done
ls -la "$OUT"
