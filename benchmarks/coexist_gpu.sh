# shellcheck shell=bash
# The GPU check of issue 50 (part 1): a ResNet-18 training script that profiles itself
# (torch.profiler, CPU+CUDA, schedule wait=5 warmup=2 active=3, on_trace_ready) alone and under
# xsp run --levels M,MF,MFL,MFLG; its own events per process and xsp's spans per level set go to
# $OUT/coexist-gpu.json. Run on the GPU machine after `source benchmarks/device_setup.sh`.
set -u
OUT=${OUT:-/tmp/out}
w=benchmarks/workloads/self_profiling_train.py
args=(--model resnet18 --steps 24 --wait 5 --warmup 2 --active 3)
rm -f /tmp/alone.jsonl /tmp/under.jsonl
timeout 90 python3 $w "${args[@]}" --counts /tmp/alone.jsonl 2>&1 | grep -v USDT | tail -2
timeout 320 python3 -m xsp run --levels "${LEVELS:-M,MF,MFL,MFLG}" --iterations 5 --warmup 2 --device cuda \
  --m-processes 1 --out /tmp/coexist-run -- python3 $w "${args[@]}" --counts /tmp/under.jsonl \
  > "$OUT/xsp-run.log" 2>&1
echo "xsp run exit $?"
grep -v USDT "$OUT/xsp-run.log" | grep -iE "xsp:|error|warning|Segmentation|torch.profiler" | head -20
python3 - <<'PY'
import json, os, pathlib
out = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
rows = {"alone": [json.loads(l) for l in open("/tmp/alone.jsonl")]}
rows["under_xsp_per_process"] = [json.loads(l) for l in open("/tmp/under.jsonl")] if os.path.exists("/tmp/under.jsonl") else []
runs = {}
for meta_path in sorted(pathlib.Path("/tmp/coexist-run").glob("*/run.json")):
    m = json.loads(meta_path.read_text())
    runs[meta_path.parent.name] = {k: m.get(k) for k in ("status", "status_reasons", "spans_by_level", "program_profiler", "cupti", "memory_events", "iterations_measured")}
rows["runs"] = runs
try:
    import pyarrow.parquet as pq, pyarrow.compute as pc
    for name in runs:
        files = sorted(pathlib.Path(f"/tmp/coexist-run/{name}").glob("spans-*.parquet"))
        if files:
            t = pq.read_table(files)
            if "kind" in t.column_names:
                runs[name]["kinds"] = {str(k): int(v) for k, v in zip(*[c.to_pylist() for c in pc.value_counts(t["kind"]).flatten()])}
except Exception as exc:
    rows["kinds_error"] = repr(exc)
(out / "coexist-gpu.json").write_text(json.dumps(rows, indent=1))
print(json.dumps(rows, indent=1)[:6000])
PY
nvidia-smi --query-gpu=name --format=csv,noheader
