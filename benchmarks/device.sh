#!/usr/bin/env bash
# The GPU machine's benchmark jobs as named presets: the setup once (benchmarks/device_setup.sh:
# the carried wheels, the project on the path, the native core built), then each preset named, in
# order. Run from the repository root on the device machine, with .whl carried; results land in
# $OUT (/tmp/out when it is unset).
#
#   bash benchmarks/device.sh PRESET [PRESET ...]
#   bash benchmarks/device.sh --list             # the presets: name, time on the H200, what
#   bash benchmarks/device.sh --local PRESET ...  # here: the python3 on PATH, no wheels, no build
#
# Settings come from the environment and are named in each preset's line (ROUNDS, CONFIGS, ...).
# One device command runs at most 10 minutes: name together only presets whose times fit.
# benchmarks/README.md says what each preset measures and which results it produced.
# shellcheck disable=SC2317  # the presets' functions are called by name, "p_$preset"
set -u

# name | time on the H200 | what it runs (settings)
PRESETS=(
  "gpu-tests|5-8 min|the GPU tests: tests/test_gpu.py, test_gpu_checks.py (kernel counts and parents, torch.compile), test_native.py, test_compiled.py; full log in gpu-tests.log (GPU_TESTS_S=500)"
  "replay|8-9 min|fresh M,MF,MFLG stores of known-layers, r50-b64-train, r50-b64-train-cl, r50-b1-infer and gpt-lm-train with their replay checks, into replay-stores.tgz; the GPU tests first (CASES=a,b to pick cases, GPU_TESTS=0 to skip the tests)"
  "trusted|4-9 min|trusted_baseline.py: each workload alone, then xsp run --levels M,MF,MFLG with M in K processes and interleaved untraced iterations, each store's two replay checks, into trusted.jsonl and trusted-stores.tgz (CASES=r50-b64-train,r50-b1-infer,amp-accum,item-loop,gpt-lm-train,hf-generate,b1-infer K=3 WALL_ROUNDS=0: K=1 against K rounds of ResNet-50 b64 training)"
  "m-spread|2-3 min|M alone in PROCESSES=8 processes of ResNet-50 b1 inference, unpinned, then all pinned to cores 0-3 (taskset), with the GPU's clocks before and after: each process's median step beside its core, clock, load and context switches (m_spread.py), into m-spread.jsonl"
  "m-alone|4-5 min (not yet run in this form)|BERT b1 inference's step in the program's own loop (fix_ab_inprocess.py's base side, 2 processes) against xsp run --levels M,MF,MFLG as it starts them (overlapping) and one at a time (XSP_OVERLAP=0), --levels M alone, and M alone with XSP_FORK_SERVER=0 and with XSP_STEADY_HEAP=0: M's interval over its processes and its last warm-up steps, into m-alone.txt (stop 58: 4.2-4.9 ms alone against M's 8.37 ms on one H100; 5.19 against 5.6-5.8 on another, 7.7-8.0 with the steady heap off, one draw each)"
  "fix-ab|2 min|fix_ab_inprocess.py: TF32 on BERT b1 inference and channels_last on ResNet-50 b64 training, each side in blocks alternating inside one process, over PROCESSES=4 processes, into fix-ab-*.jsonl (the truth for estimate-accuracy)"
  "verify|5-7 min|xsp verify of the replay preset's ResNet-50 b1 inference store (run replay first on the same machine): launch-bound (compile) and fp32-on-tensor-cores (tf32), ROUNDS=3, into verify-*.json"
  "verify-in-process|5-9 min (not yet run)|xsp verify --in-process against paired processes on a fresh M,MF,MFLG store of CASE=bert-b1-infer (its fp32-on-tensor-cores rule: tf32) or CASE=r50-b64-train (layout-transposes: channels_last), verified both ways (ROUNDS=2), into verify-CASE-in-process.json and verify-CASE-paired.json"
  "verify-infer|8-9 min|a fresh M,MF,MFLG store of BERT b1 inference and xsp verify of every rule that fires on it; xsp verify of launch-bound (cuda_graphs) on a ResNet-50 b1 inference store carried in xsp-runs/r50-b1-infer (VERIFY_R50=); ROUNDS=2, into verify-*.json"
  "estimate-accuracy|4-5 min|estimate_accuracy.py: fresh M,MF,MFLG stores of ResNet-50 b64 training and BERT b1 inference; each kernel-changing rule's modelled estimate, xsp estimate's (the changed ops timed in isolation, replayed), xsp verify's measured gain and the fix alternating inside one process (fix_ab_inprocess.py, 3 processes), into estimate-accuracy.{json,txt} (CASES=r50-b64-train,bert-b1-infer ROUNDS=2 ITERATIONS=8 ESTIMATES=3: xsp estimate processes)"
  "overhead-train|5 min|overhead.py, ResNet-50 b64 training, fresh process per configuration (ROUNDS=3 ITERS=30 CONFIGS=none,MF(no shapes),MFLG,torch.profiler(cpu+cuda))"
  "overhead-b1|5 min|overhead.py, ResNet-50 and MobileNetV2 batch-1 inference (ROUNDS=3 ITERS=30 CONFIGS as overhead-train)"
  "overhead-gpt|4 min|overhead.py, the GPT LM training step (ROUNDS=3 ITERS=30 CONFIGS as overhead-train)"
  "overhead-compiled|5 min|overhead.py, torch.compile'd ResNet-18 b32 training (ROUNDS=2 ITERS=30 CONFIGS=none,MF(no shapes),MFLG)"
  "inprocess|6 min|inprocess.py: level sets against the untraced loop in rounds inside one process, four cases"
  "ncu-probe|1 min|Nsight Compute: its metrics, the ones xsp picks, one tiny kernel under the whole set and the lean one (XSP_NCU=path)"
  "counter-calibration|2 min|counter_calibration.py: GEMMs of known shape and a 2 GiB copy under ncu, into calibration/"
  "counters|6 min|xsp run of ResNet-50 b64 training at M,MF,MFLG and the counter run MH; its analyses; the store as r50-b64-train-counters.tgz"
  "campaign|up to 9 min|one part of campaigns/default.toml, resumable, and its campaign_time.py figures (PART=0/1 ONLY= KEEP= PREV= LIMIT_S=480 EXTRA= FIRST_ALONE=1)"
  "views|2 min|the GPT LM training script, unmodified, at M,MF,MFLG; its analyses and store (gpt-store.tgz)"
  "ddp|4 min|2-GPU ResNet-50 DDP training (nvidia-h200-x2), untraced and at M,MF,MFLG; its analyses and store"
  "r50-stores|4 min|the committed leveled stores benchmarks/data/r50-b64-train (M,MF,MFL,MFLG x 20) and r50-b64-train-cl (M,MFLG x 5) into r50-b64-train.tgz"
  "compiled-attribution|2 min|torch.compile'd ResNet-18 b32 training at MFLG, first measured iteration: Triton kernels, the wrapper's extern ops (mm, convolution) and the cuBLAS/cuDNN kernels under them below the compiled root, into compiled-attribution.json (MODEL= BATCH= DEVICE=)"
  "compiled-run|2-3 min|the torch.compile'd ResNet-18 b32 training script (benchmarks/workloads/compiled_resnet18.py) alone, with a cold inductor cache, then under xsp run --levels M,MF,MFLG: wall seconds of both and their ratio, each level set's seconds, phases and inductor_cache (graphs saved, loaded), into compiled-run.json (STEPS=30); EXIT_COST=1 first times the script's exit alone, cold, warm, warm with TORCH_WARM_POOL=0 and with TORCHINDUCTOR_COMPILE_THREADS=1, into compiled-exit.txt"
  "memory|1 min|ResNet-50 b64 training at M,MF,MFLG: memory per layer and per layer type, into memory-r50-b64-train.json"
  "cuda-fixtures|1 min|the native CUDA capture fixtures of the tests (tests/data/resnet18_train_{mf,mflg}_cuda_native) into fixtures/"
  "cuda-graphs|3-4 min|CUDA graph attribution: the small-CNN fixtures (graphed and eager training, compiled reduce-overhead and default inference) into fixtures/, tests/test_cuda_graphs.py, and cuda_graphs.py (make_graphed_callables training; ResNet-18 compiled reduce-overhead) into cuda-graphs.json (FIXTURES=0: the benchmark only)"
  "llama-1b|5-7 min|transformers:llama-1b (1.03B parameters) b8 x 1024 training, --fix bf16, at M,MF,MFLG (3 iterations): spans per iteration, finish µs per span, peak RSS, xsp analyze's time, the Jaeger trace's spans and the Perfetto export's size (large_trace.py --store); run.json files and analyze output into llama-1b/"
  "llama-accum|6-8 min|benchmarks/workloads/llama_accum_train.py (llama-1b's shape, 4 micro-batches of 2 x 1024, bf16 autocast) untraced, then at M,MF,MFLG (2 iterations, --warmup 9: 4 forward passes, then optimizer steps): the figures of llama-1b, into llama-accum/"
  "service|1-2 min|service_overhead.py on CUDA: a batch-1 MLP service (width 2048) untraced, M on every request, F, and F with L and G, sampled 1 in 100, and F on every request, in shuffled rounds in one process, into service-overhead-cuda.json (ROUNDS=12 REQUESTS=1000 SAMPLED=MF,MFLG: level sets sampled, comma-separated)"
  "cupti-attach|1 min|cupti_attach_cost.py: a batch-1 MLP request untraced, with CUPTI recording, attached with its kinds off, finalized; and CUPTI started and finalized around single requests (its phases), into cupti-attach-cost.json"
  "ddp-gloo|3-4 min|the two-rank gloo DDP straggler (benchmarks/workloads/ddp_gloo_straggler.py) on the host's CPU, ROUNDS=3 measurements at M,MF (40 iterations, 15 warm-up): each one's replay against M, the collective waits and the straggler suggestion, and the stores; then its fix measured: M alone, unbalanced and --balanced alternating (PAIRS=3), into ddp-gloo/"
  "two-streams|1-2 min|the two-stream workload (benchmarks/workloads/two_streams.py: an event wait joins the streams) at M,MF,MFLG and its replay, into two-streams/ (the store for benchmarks/data/replay-h200/two-streams)"
  "fork-run|5-6 min|xsp run --model four ways: level sets forked from a preloaded server and overlapped with MF after M in M's process (the default), the same with MF in its own (XSP_SHARE_PROCESS=0), forked one at a time (XSP_OVERLAP=0), fresh interpreters one at a time (XSP_FORK_SERVER=0), in rotating rounds beside the untraced loop: ResNet-50 b1 inference (ROUNDS=2) and b64 training (one round); wall, phases, M's step, the replay; fork-run-*.json"
  "share-run|5-6 min|xsp run --model M,MF,MFLG with MF after M in M's process (the default) and in a process of its own (XSP_SHARE_PROCESS=0), in rotating rounds beside the untraced loop: ResNet-50 b1 inference, MobileNetV3-large b1 inference, ResNet-50 b64 training (ROUNDS=3); wall, each level set's step and phases, the replay against M; share-run-*.json"
  "calibration|1-2 min|calibration_spread.py: F's calibration repeated in one process on CUDA (an MF session of one ResNet-18 b1 inference iteration each), rounds of CALLSxROUNDS each (CONFIGS=20x5,50x7,25x5,20x4,10x7 REPEATS=10), into calibration-spread.json"
  "first-step|1 min|where a fresh CUDA process's first iteration goes (ResNet-50 b1 inference), and what loading cuDNN's and cuBLAS's libraries before CUDA starts saves (ROUNDS=3); into first-step.jsonl"
  "cold-start|2.5-3.5 min|issue 31's cold first process: ResNet-50 b64 training, 40 iterations, xsp run --levels MFLG twice then --levels M, as the machine's first GPU work (name it first), then the untraced loop twice, MFLG once more and the untraced loop again, then BYTECODE_ROUNDS=3 rounds of the untraced loop and MFLG with Python's bytecode cached (the image writes none); wall time, each process's phases (manifest), xsp run's own seconds and the switch-on's parts into cold-start.json"
  "cpu-demo|2-3 min|the CPU demo's command (ResNet-18 b2 inference, M,MF, 3 iterations) on 2 pinned cores (taskset), the steady heap on and off alternating (PAIRS=3), and once on 8 cores; into cpu-demo.json"
  "runner-cost|1-2 min|where xsp run's own process spends the seconds outside its level sets: xsp run --help and xsp summary of a fresh MFLG store (ResNet-50 b64 training, 10 iterations), as the image runs Python (no bytecode written) and with bytecode cached; the summary's imports, and its profile with bytecode cached (that store and r50-b64-train-cl); into runner-cost.txt, summary-importtime.txt, summary-profile-*.txt"
  "parent-imports|1 min|what xsp run's own process imports on CUDA (ResNet-18 b8, --levels M): python -X importtime, the chain that brings torch in, into parent-imports.txt"
  "conversion|1 min|conversion.py: raw records to span table and parquet, spans/s and bytes per span (CPU)"
  "collector|1 min|collector_load.py: OTLP/HTTP spans/s into xsp collector serve (CPU; LOAD_S=10 CLIENTS=2)"
  "analyze|1 min|analyze.py: time and peak memory of xsp analyze on benchmarks/data/r50-b64-train (CPU; REPEATS=5)"
)

usage() {
  echo "usage: bash benchmarks/device.sh [--local] PRESET [PRESET ...] | --list"
  echo "presets:"
  list | sed 's/^/  /'
}

list() {
  local line name time what
  for line in "${PRESETS[@]}"; do
    IFS='|' read -r name time what <<<"$line"
    printf '%-20s %-11s %s\n' "$name" "$time" "$what"
  done
}

known() {
  local line
  for line in "${PRESETS[@]}"; do
    [ "${line%%|*}" = "$1" ] && return 0
  done
  return 1
}

# --- the presets ------------------------------------------------------------------------------
# A script's F process runs an untraced iteration before each traced one: its --steps cover
# --warmup plus twice --iterations.

p_gpu_tests() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  # one pytest per file, so that a file's failures and tracebacks are written when it ends,
  # not lost with the rest when the time limit stops the suite (it did after 38 tests)
  local rc=0 file deadline=$(( $(date +%s) + ${GPU_TESTS_S:-500} ))
  : > "$OUT/gpu-tests.log"
  set -o pipefail
  for file in tests/test_gpu.py tests/test_gpu_checks.py tests/test_native.py \
      tests/test_compiled.py tests/test_sources.py; do
    local left=$(( deadline - $(date +%s) ))
    if (( left <= 0 )); then echo "$file: not run (GPU_TESTS_S spent)" | tee -a "$OUT/gpu-tests.log"; rc=1; continue; fi
    timeout "$left" python3 -m pytest -q -p no:cacheprovider --tb=short "$file" 2>&1 \
      | tee -a "$OUT/gpu-tests.log" | grep -E "^E |^(FAILED|ERROR|SKIPPED)|passed|failed" || rc=1
  done
  set +o pipefail
  return "$rc"
}

# The replay issue's fixtures: fresh measurements with the current capture (calibration, settling
# warm-up) of ResNet-50 b64 training (NCHW and channels_last), ResNet-50 b1 inference (host-bound),
# the GPT LM training script and the known-duration workload (with its CUDA-event truth), brought back as one archive; the GPU tests.
p_replay() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  [ "${GPU_TESTS:-1}" = 1 ] && gpu_tests 320
  R=/tmp/replay; mkdir -p "$R"
  xrun() { timeout "$1" python3 -m xsp run "${@:2}" 2>&1 | tail -12; }
  want() { [[ ",${CASES:-known-layers,r50-b64-train,r50-b64-train-cl,r50-b1-infer,gpt-lm-train}," == *",$1,"* ]]; }
  if want known-layers; then
    python3 benchmarks/workloads/known_layers.py --truth "$R/known-truth.json" --steps 60
    xrun 150 --levels M,MF,MFLG --iterations 20 --warmup 5 --device cuda --out "$R/known-layers" \
      -- python3 benchmarks/workloads/known_layers.py --steps 50
    cp "$R/known-truth.json" "$R/known-layers/truth.json"
  fi
  common=(--model torchvision:resnet50 --batch-size 64 --mode train --levels "M,MF,MFLG" --iterations 20 --warmup 3 --device cuda)
  want r50-b64-train && xrun 200 "${common[@]}" --out "$R/r50-b64-train"
  want r50-b64-train-cl && xrun 200 "${common[@]}" --channels-last --out "$R/r50-b64-train-cl"
  want r50-b1-infer && xrun 200 --model torchvision:resnet50 --batch-size 1 --mode infer \
    --levels M,MF,MFLG --iterations 20 --warmup 3 --device cuda --out "$R/r50-b1-infer"
  want gpt-lm-train && xrun 200 --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda \
    --out "$R/gpt-lm-train" -- python3 benchmarks/workloads/gpt_lm_train.py --steps 40
  python3 - <<'PY'
import json, glob
for p in sorted(glob.glob("/tmp/replay/*/*/run.json")):
    m = json.load(open(p))
    print(p, m.get("status"), "warmup", m.get("warmup"), m.get("warmup_settled"), "calib", m.get("calibration"))
PY
  python3 - <<'PY'
from pathlib import Path
from xsp.analysis.replay import critical_path
from xsp.analysis.replay import replay
from xsp.analysis.measurement.store import MeasurementStore
for root in sorted(p for p in Path("/tmp/replay").iterdir() if p.is_dir()):
    store = MeasurementStore(root)
    found = replay(store).summary()
    print(root.name, "replayed", round(found["step_ms"], 3), "M", round(found["measured_step_ms"], 3),
          "error %", round(found["error_pct"], 2), found["calibration"], found["checks"],
          "in-process", found["in_process"], "M interval", found["m_interval"],
          "unchecked", found["unchecked"])
    print("  ", critical_path.verdict(store))
PY
  tar -C "$R" -czf "$OUT/replay-stores.tgz" .
  ls -la "$OUT"
}

# The trusted-baseline issue's workloads and figures (benchmarks/trusted_baseline.py).
p_trusted() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  timeout 560 python3 benchmarks/trusted_baseline.py --stores /tmp/trusted --out "$OUT/trusted.jsonl" \
    --cases "${CASES:-r50-b64-train,r50-b1-infer,amp-accum,item-loop,gpt-lm-train,hf-generate,b1-infer}" \
    --m-processes "${K:-3}" --wall-rounds "${WALL_ROUNDS:-0}" 2>&1 | cut -c1-1500
  rm -rf /tmp/trusted/wall-*
  tar -C /tmp/trusted -czf "$OUT/trusted-stores.tgz" .
  ls -la "$OUT"
}

# Where M's spread between processes comes from: M alone in several processes, unpinned and
# pinned to four cores, with the GPU's clocks around them.
p_m_spread() {
  local pinned
  for pinned in no yes; do
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
    local run=(python3 -m xsp run --model torchvision:resnet50 --batch-size 1 --levels M \
      --iterations 30 --warmup 5 --device cuda --m-processes "${PROCESSES:-8}" --out "/tmp/spread-$pinned")
    [ "$pinned" = yes ] && run=(taskset -c 0-3 "${run[@]}")
    timeout 280 "${run[@]}" 2>&1 | grep -E "^M over|error" | tee -a "$OUT/m-spread.txt"
    python3 benchmarks/m_spread.py "/tmp/spread-$pinned" --label "pinned-$pinned" >>"$OUT/m-spread.jsonl"
  done
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  cat "$OUT/m-spread.jsonl"
}

# xsp verify on the replay preset's host-bound store: each fix re-run in paired rounds against
# the workload as it was, then once at MFLG (the mechanism), into verify-<fix>.json.
p_verify() {
  local store=/tmp/replay/r50-b1-infer rule fix
  [ -f "$store/manifest.json" ] || { echo "verify: no $store (run the replay preset first)"; return 1; }
  for pair in launch-bound:compile fp32-on-tensor-cores:tf32; do
    rule=${pair%%:*} fix=${pair##*:}
    timeout 280 python3 -m xsp verify "$store" --rule "$rule" --rounds "${ROUNDS:-3}" --json \
      >"$OUT/verify-r50-b1-infer-$fix.json" 2>"$OUT/verify-r50-b1-infer-$fix.log"
    echo "verify $rule: rc $?"; tail -c 1500 "$OUT/verify-r50-b1-infer-$fix.json"; echo
  done
  tar -C "$store" -czf "$OUT/verify-r50-b1-infer-runs.tgz" verify
}

# The issue's inference verifications: a zoo transformer and ResNet-50 at batch 1, measured, then
# each suggestion re-run with its fix (launch-bound: cuda_graphs).
p_verify_infer() {
  local R=/tmp/verify-infer
  mkdir -p "$R"
  timeout 120 python3 -m xsp run --model transformers:bert --batch-size 1 --mode infer \
    --levels M,MF,MFLG --iterations 20 --warmup 3 --device cuda --out "$R/bert-b1-infer" 2>&1 | tail -4
  verify_rows 280 "$R/bert-b1-infer" bert-b1-infer
  # a ResNet-50 b1 inference store carried in xsp-runs/ (VERIFY_R50=path), its launch-bound rule
  if [ -f "${VERIFY_R50:-xsp-runs/r50-b1-infer}/manifest.json" ]; then
    verify_rows 170 "${VERIFY_R50:-xsp-runs/r50-b1-infer}" r50-b1-infer-cuda-graphs --rule launch-bound
  fi
}

# A fix alternating inside each process (xsp verify --in-process) against paired processes, on
# the host-bound BERT b1 step (TF32 saved 0.13-0.17 ms of 4.5 in fix_ab_inprocess.py) and the
# GPU-bound ResNet-50 b64 training step (channels_last 8.5-9.5 ms).
p_verify_in_process() {
  local R=/tmp/verify-in-process case=${CASE:-bert-b1-infer}
  local -A workload=([bert-b1-infer]="transformers:bert 1 infer 20" [r50-b64-train]="torchvision:resnet50 64 train 10")
  local -A rule=([bert-b1-infer]=fp32-on-tensor-cores [r50-b64-train]=layout-transposes)
  read -r model batch mode iterations <<<"${workload[$case]}"
  timeout 120 python3 -m xsp run --model "$model" --batch-size "$batch" --mode "$mode" \
    --levels M,MF,MFLG --iterations "$iterations" --warmup 5 --device cuda --out "$R/$case" \
    --replace 2>&1 | tail -2
  verify_rows 220 "$R/$case" "$case-in-process" --rule "${rule[$case]}" --in-process
  verify_rows 220 "$R/$case" "$case-paired" --rule "${rule[$case]}"
}

# issue 52's estimates: each kernel-changing rule's estimate, modelled and from ops timed in
# isolation (xsp estimate), against xsp verify's measured gain.
# Why BERT b1's M step (8.4 ms on one H100, over 3 processes) stood near twice the program's own
# loop there (4.2-4.9 ms): the leveled run as xsp starts it (its level-set processes overlap:
# MFLG's warm-up ran beside M's), one process at a time (XSP_OVERLAP=0), M alone, and the
# fork server and steady heap off.
p_m_alone() {
  local bert=(--model transformers:bert --batch-size 1 --mode infer --iterations 20 --warmup 5
    --device cuda --replace)
  timeout 60 python3 benchmarks/fix_ab_inprocess.py --case bert-b1-infer:tf32 --processes 2 \
    --blocks 4 --iterations 20 | grep -o '"base_ms": [0-9.]*' | sed 's/^/alone /' | tee "$OUT/m-alone.txt"
  local name env levels
  for name in leveled leveled-one-at-a-time m-only fork-server-off steady-heap-off; do
    env=(XSP_FORK_SERVER=1) levels=(--levels M --m-processes 1)  # the default, named
    case $name in
      leveled) levels=(--levels M,MF,MFLG) ;;
      leveled-one-at-a-time) levels=(--levels M,MF,MFLG) env=(XSP_OVERLAP=0) ;;
      fork-server-off) env=(XSP_FORK_SERVER=0) ;;
      steady-heap-off) env=(XSP_STEADY_HEAP=0) ;;
    esac
    timeout 120 env "${env[@]}" python3 -m xsp run "${bert[@]}" "${levels[@]}" \
      --out "/tmp/m-alone-$name" 2>&1 | grep -E "^M over" | sed "s/^/$name: /" | tee -a "$OUT/m-alone.txt"
    python3 -c "import json,sys; print(sys.argv[1], 'warm-up steps ms', json.load(open(sys.argv[2]))['warmup_steps_ms'][-4:])" \
      "$name" "/tmp/m-alone-$name/M/run.json" | tee -a "$OUT/m-alone.txt"
  done
}

p_fix_ab() {
  timeout 280 python3 benchmarks/fix_ab_inprocess.py --case bert-b1-infer:tf32 \
    --processes "${PROCESSES:-4}" --blocks 12 --iterations 20 | tee "$OUT/fix-ab-bert-tf32.jsonl" | tail -1
  timeout 280 python3 benchmarks/fix_ab_inprocess.py --case r50-b64-train:channels_last \
    --processes "${PROCESSES:-4}" --blocks 6 --iterations 10 | tee "$OUT/fix-ab-r50-cl.jsonl" | tail -1
}

p_estimate_accuracy() {
  timeout 570 python3 benchmarks/estimate_accuracy.py --stores /tmp/estimate-accuracy --out "$OUT" \
    --cases "${CASES:-r50-b64-train,bert-b1-infer}" --rounds "${ROUNDS:-2}" \
    --iterations "${ITERATIONS:-8}" --estimates "${ESTIMATES:-3}" 2>&1 | tail -12
}

verify_rows() {  # limit_s run_dir name [xsp verify options]: rows into $OUT/verify-<name>.json
  timeout "$1" python3 -m xsp verify "$2" --rounds "${ROUNDS:-2}" --json "${@:4}" \
    >"$OUT/verify-$3.json" 2>"$OUT/verify-$3.log"
  echo "verify $3: rc $?"; tail -3 "$OUT/verify-$3.log"
  python3 -c "import json,sys; [print(r) for r in json.load(open(sys.argv[1]))['rows']]" \
    "$OUT/verify-$3.json"
  tar -C "$2" -czf "$OUT/verify-$3-runs.tgz" --exclude='*/MFLG/spans-*' verify
}

# overhead.py: one fresh process per (round, case, configuration); step, paired step, end to end
# and peak RSS against the untraced process (the figures the goals are read against).
OVERHEAD_CONFIGS="none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
p_overhead_train() {
  overhead 300 r50-train --rounds "${ROUNDS:-3}" --iters "${ITERS:-30}" \
    --cases torchvision:resnet50/train/64 --configs "${CONFIGS:-$OVERHEAD_CONFIGS}"
}
p_overhead_b1() {
  overhead 150 r50-infer-b1 --rounds "${ROUNDS:-3}" --iters "${ITERS:-30}" \
    --cases torchvision:resnet50/infer/1 --configs "${CONFIGS:-$OVERHEAD_CONFIGS}"
  overhead 140 mobilenet-b1 --rounds "${ROUNDS:-3}" --iters "${ITERS:-30}" \
    --cases torchvision:mobilenet_v2/infer/1 --configs "${CONFIGS:-$OVERHEAD_CONFIGS}"
}
p_overhead_gpt() {  # about 20 s per process on the H200
  overhead 250 gpt-lm --rounds "${ROUNDS:-3}" --iters "${ITERS:-30}" --cases gpt-lm/train/16 \
    --configs "${CONFIGS:-$OVERHEAD_CONFIGS}"
}
p_overhead_compiled() {  # about 60 s per process: each compiles afresh, inductor's caches off
  overhead 300 compiled --rounds "${ROUNDS:-2}" --iters "${ITERS:-30}" \
    --cases compiled:torchvision:resnet18/train/32 --configs "${CONFIGS:-none,MF(no shapes),MFLG}"
}

# inprocess.py: every level set against the untraced loop in one process per case, in rounds
# (the host's drift cancels within a round).
p_inprocess() {
  case_() {  # seconds, name, inprocess.py arguments...
    local limit=$1 name=$2; shift 2
    timeout "$limit" python3 benchmarks/inprocess.py --out "$OUT/inprocess-$name.json" "$@" 2>&1 \
      | grep -v "^\[transformers\]" | tail -14
  }
  case_ 110 r50-infer-b1 --case torchvision:resnet50/infer/1 --rounds 8 --iters 100 \
    --configs "none,MF,MLG,MFLG,MFLG(no correlation)"
  case_ 110 r50-train-b64 --case torchvision:resnet50/train/64 --rounds 6 --iters 50 \
    --configs "none,MF,MFLG"
  case_ 90 gpt-lm --case gpt-lm/train/16 --rounds 6 --iters 50 --configs "none,MF,MFLG"
  case_ 70 mobilenet-b1 --case torchvision:mobilenet_v2/infer/1 --rounds 6 --iters 100 \
    --configs "none,MF,MFLG"
}

# The hardware-counter level, with Nsight Compute on PATH (or XSP_NCU).
ncu_header() {
  NCU=${XSP_NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
  echo "ncu: $NCU"; "$NCU" --version 2>&1 | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
}

# ncu's version and the metrics the GPU offers (--query-metrics), the metrics xsp picks from
# them, and one tiny kernel profiled with the whole set (and the lean one: its replay passes); if
# ncu refuses the set, every metric is tried alone and the bad ones are named.
p_ncu_probe() {
  ncu_header
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
  local metrics lean tiny
  metrics=$(python3 -c 'from xsp.tracer.run import ncu; print(",".join(ncu.selection(ncu.find())[0]))')
  tiny='import torch; torch.cuda.profiler.start(); (torch.ones(1 << 20, device="cuda") * 2).sum(); torch.cuda.synchronize(); torch.cuda.profiler.stop()'
  if "$NCU" --target-processes all --clock-control none --profile-from-start off --metrics "$metrics" \
      --csv --page raw --print-units base python3 -c "$tiny" > "$OUT/ncu-tiny.csv" 2> "$OUT/ncu-tiny.err"; then
    echo "the whole metric set profiles: $(grep -c '^"[0-9]' "$OUT/ncu-tiny.csv") kernels"
    grep -h "passes" "$OUT/ncu-tiny.csv" "$OUT/ncu-tiny.err" | head -3
    lean=$(XSP_COUNTER_METRICS=lean python3 -c 'from xsp.tracer.run import ncu; print(",".join(ncu.selection(ncu.find())[0]))')
    echo "lean set (XSP_COUNTER_METRICS=lean):"
    "$NCU" --profile-from-start off --metrics "$lean" python3 -c "$tiny" 2>&1 | grep passes | head -3
  else
    echo "ncu refused the set: $(grep -h ERROR "$OUT/ncu-tiny.csv" "$OUT/ncu-tiny.err" | head -3)"
    local m
    for m in ${metrics//,/ }; do
      if ! "$NCU" --profile-from-start off --metrics "$m" python3 -c "$tiny" > /dev/null 2>&1; then
        echo "bad metric: $m" | tee -a "$OUT/ncu-bad-metrics.txt"
      fi
    done
  fi
}

# GEMMs of known shape (fp32, tf32, bf16, fp16) and a 2 GiB copy kernel under ncu against
# 2*M*N*K and the bytes moved; commit calibration/counter-calibration.json as
# benchmarks/results/counter-calibration-h200.json.
p_counter_calibration() {
  ncu_header
  python3 benchmarks/counter_calibration.py --out /tmp/calibration 2>&1 | tail -12
  mkdir -p "$OUT/calibration"
  cp /tmp/calibration/counter-calibration.json /tmp/calibration/calibration-raw.csv \
    /tmp/calibration/ncu.log "$OUT/calibration/" 2>/dev/null
}

# xsp run of ResNet-50 b64 training at M, MF, MFLG and the counter run MH (one iteration under
# ncu), timed; its analyses as JSON and HTML; the store as a tarball
# (benchmarks/data/r50-b64-train-counters), ncu's report apart.
p_counters() {
  ncu_header
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
  python3 -m xsp analyze /tmp/r50c --rows 5 --report "$OUT/r50c-report.html" 2>&1 \
    | grep -A40 "matched to the G run" | head -60
  python3 - "$OUT/r50c-analyze.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["analyses"]
print("counter_matching", a.get("counter_matching", {}).get("rows"))
print("model_metrics", a.get("model_metrics", {}).get("rows"))
print("hardware_counters", a.get("hardware_counters"))
PY
  mkdir -p /tmp/ncu-reports && mv /tmp/r50c/MH/counters.ncu-rep /tmp/ncu-reports/ 2>/dev/null
  cp /tmp/r50c/MH/ncu.log "$OUT/r50c-ncu.log" 2>/dev/null
  rm -rf /tmp/r50-b64-train-counters && mv /tmp/r50c /tmp/r50-b64-train-counters
  tar -C /tmp -czf "$OUT/r50-b64-train-counters.tgz" r50-b64-train-counters
  tar -C /tmp -czf "$OUT/r50c-ncu-report.tgz" ncu-reports
  mv /tmp/r50-b64-train-counters /tmp/r50c
}

# One part of the default campaign on the device machine (every GPU, one job each), stopped
# after LIMIT_S seconds; a rerun resumes where it stopped. PART=i/k runs every k-th model from
# the i-th, so that each part spans the model families; ONLY=globs (comma-separated) names the
# models instead; PREV=DIR resumes DIR (carried). Back in $OUT: the job records, manifests and
# logs (campaign-part.tgz; span files stay behind, they are too large to return), the complete
# stores of the KEEP models (stores.tgz), and campaign_time.py's figures for the part.
p_campaign() {
  local part=${PART:-0/1} only keep start
  keep=${KEEP:-"torchvision-resnet50__infer__b1 transformers-bert__infer__b16"}
  only=${ONLY:-$(python3 - "$part" <<'PY'
import sys, tomllib
names = tomllib.load(open("campaigns/default.toml", "rb"))["models"]["names"]
i, k = map(int, sys.argv[1].split("/"))
print(",".join(names[i::k]))
PY
)}
  nvidia-smi -L > "$OUT/gpus.txt"
  if [ -n "${PREV:-}" ]; then cp -r "$PREV" /tmp/c; fi
  start=$(date +%s)
  # the first job alone: if it fails, say how, and run the rest without the fork server
  # (FIRST_ALONE=0: one campaign command for the whole part, one fork server start)
  [ "${FIRST_ALONE:-1}" = 0 ] || python3 -m xsp campaign run campaigns/default.toml --out /tmp/c \
    --only "$only" --limit 1 > "$OUT/first-job.log" 2>&1
  if [ "${FIRST_ALONE:-1}" != 0 ] && ! grep -q '"status": "ok"' /tmp/c/jobs/*.json 2>/dev/null; then
    echo "first job failed: XSP_FORK_SERVER=0 from here" | tee -a "$OUT/first-job.log"
    cat /tmp/c/runs/*/*.stderr.log >> "$OUT/first-job.log" 2>/dev/null
    export XSP_FORK_SERVER=0
  fi
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  timeout "${LIMIT_S:-480}" python3 -m xsp campaign run campaigns/default.toml --out /tmp/c \
    --only "$only" ${EXTRA:-} > "$OUT/campaign.log" 2>&1
  echo "campaign part $part: $(( $(date +%s) - start )) s" | tee -a "$OUT/campaign.log"
  tail -3 "$OUT/campaign.log"
  python3 benchmarks/campaign_time.py /tmp/c 2>&1 | tee "$OUT/campaign-time.txt"
  tar -C /tmp -czf "$OUT/campaign-part.tgz" --exclude='*.parquet' c
  # shellcheck disable=SC2046,SC2086  # the KEEP stores that exist, one word each
  (cd /tmp/c/runs && tar -czf "$OUT/stores.tgz" $(ls -d $keep 2>/dev/null))
  ls -la "$OUT"
}

# A small GPT training script, unmodified, at M, MF and MFLG; its analyses as JSON (suggestion
# gains against the untraced step) and its store (benchmarks/data/gpt-lm-train).
p_views() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 benchmarks/workloads/gpt_lm_train.py --steps 40 2>&1 | tail -2
  python3 -m xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out /tmp/gpt \
    -- python benchmarks/workloads/gpt_lm_train.py --steps 40 2>&1 | tail -25
  python3 -m xsp analyze /tmp/gpt --json > "$OUT/gpt-analyze.json" 2> "$OUT/gpt-analyze.err"
  python3 -m xsp analyze /tmp/gpt --rows 8 2>&1 | head -60
  python3 - "$OUT/gpt-analyze.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("reconstruction", d["reconstruction"])
for r in d["analyses"]["suggestions"]["rows"]:
    print("suggestion", r["rule"], round(r["gain_ms_per_iteration"], 3), "ms", round(r["share_pct"], 1), "%")
PY
  tar -C /tmp -czf "$OUT/gpt-store.tgz" gpt
  ls -la "$OUT"
}

# The NCCL issue's job (the nvidia-h200-x2 kind): ResNet-50 DDP training, batch 64 per GPU,
# untraced and under xsp run at M, MF and MFLG; its analyses as JSON and HTML.
p_ddp() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  nvidia-smi --query-gpu=index,name --format=csv,noheader
  python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30 \
    2>&1 | grep "median step" | tee "$OUT/ddp-untraced.txt"
  python3 -m xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out /tmp/ddp -- \
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30 \
    2>&1 | tail -20
  python3 -m xsp analyze /tmp/ddp --json > "$OUT/ddp-analyze.json" 2> "$OUT/ddp-analyze.err"
  python3 -m xsp analyze /tmp/ddp --rows 8 --report "$OUT/ddp-report.html" 2>&1 | tail -40
  tar -C /tmp -czf "$OUT/ddp-r50-b64-nccl.tgz" ddp
}

# The leveled stores the tests and the analyze benchmark read: benchmarks/data/r50-b64-train
# (the reconstruction's acceptance) and r50-b64-train-cl (the layout suggestion).
p_r50_stores() {
  rm -rf /tmp/r50-b64-train /tmp/r50-b64-train-cl
  python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MF,MFL,MFLG \
    --iterations 20 --warmup 3 --device cuda --out /tmp/r50-b64-train 2>&1 | tail -9
  python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MFLG \
    --iterations 5 --warmup 3 --device cuda --channels-last --out /tmp/r50-b64-train-cl 2>&1 | tail -3
  tar -C /tmp -czf "$OUT/r50-b64-train.tgz" r50-b64-train r50-b64-train-cl
}

# What a compiled script costs under xsp run (issue 31): the script alone with a cold inductor
# cache, then a leveled measurement, whose first level set compiles and the others load.
p_compiled_run() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  local script=(python3 benchmarks/workloads/compiled_resnet18.py --steps "${STEPS:-30}" --batch-size 32)
  local t0 t1 t2
  rm -rf /tmp/r18c /tmp/r18c-alone-cache
  t0=$(date +%s.%N)
  TORCHINDUCTOR_CACHE_DIR=/tmp/r18c-alone-cache "${script[@]}" 2>&1 | tail -1
  t1=$(date +%s.%N)
  # where the script's own process spends its seconds outside its loop: before main, and from
  # main's end to the process's end (its exit), with a cold and then a warm inductor cache, then
  # warm with torch's compile workers started only when needed (TORCH_WARM_POOL=0), and warm
  # with none (TORCHINDUCTOR_COMPILE_THREADS=1)
  if [ -n "${EXIT_COST:-}" ]; then
    for cache in cold warm warm-no-warm-pool warm-one-compile-thread; do
      [ "$cache" = cold ] && rm -rf /tmp/r18c-exit-cache
      local began pool=1 threads=; began=$(date +%s.%N)
      [ "$cache" = warm-no-warm-pool ] && pool=0
      [ "$cache" = warm-one-compile-thread ] && threads=1
      env ${threads:+TORCHINDUCTOR_COMPILE_THREADS=$threads} TORCH_WARM_POOL=$pool \
        TORCHINDUCTOR_CACHE_DIR=/tmp/r18c-exit-cache python3 - "${STEPS:-30}" <<'PY' 2>&1 | tail -2
import runpy, sys, time
sys.argv = ["compiled_resnet18.py", "--steps", sys.argv[1], "--batch-size", "32"]
print("main_start", time.time())
runpy.run_path("benchmarks/workloads/compiled_resnet18.py", run_name="__main__")
print("main_end", time.time(), flush=True)
PY
      echo "$cache: began $began, process_end $(date +%s.%N)"
    done 2>&1 | tee "$OUT/compiled-exit.txt"
    t0=$(date +%s.%N); TORCHINDUCTOR_CACHE_DIR=/tmp/r18c-alone-cache "${script[@]}" 2>&1 | tail -1; t1=$(date +%s.%N)
  fi
  env -u TORCHINDUCTOR_CACHE_DIR python3 -m xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 \
    --device cuda --out /tmp/r18c -- "${script[@]}" 2>&1 | tail -4
  t2=$(date +%s.%N)
  python3 - "$t0" "$t1" "$t2" "$OUT/compiled-run.json" <<'PY'
import json, sys
from pathlib import Path
t0, t1, t2 = map(float, sys.argv[1:4])
runs = {}
for entry in json.loads(Path("/tmp/r18c/manifest.json").read_text())["runs"]:
    meta = json.loads(Path("/tmp/r18c", entry["levels"], "run.json").read_text())
    runs[entry["levels"]] = {"status": entry["status"], "seconds": entry.get("seconds", {}).get("total"),
                             "phases": entry.get("seconds"), "inductor_cache": meta.get("inductor_cache")}
out = {"alone_s": round(t1 - t0, 1), "xsp_run_s": round(t2 - t1, 1),
       "ratio": round((t2 - t1) / (t1 - t0), 2), "runs": runs}
json.dump(out, open(sys.argv[4], "w"), indent=1)
print(json.dumps(out))
PY
}

# A ResNet-50 b64 training measurement's memory analyses (allocator events per layer and type).
p_compiled_attribution() {
  python3 - "${MODEL:-torchvision:resnet18}" "${BATCH:-32}" "${DEVICE:-cuda}" "$OUT/compiled-attribution.json" <<'PY'
import json, sys
import torch
from tests.test_gpu_checks import compiled_attribution
model, batch, device, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
found = compiled_attribution(model, batch, 3, device=device)
found.pop("named_modules")
name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
out = {"model": model, "batch": batch, "device": name, "torch": torch.__version__,
       "levels": "MFLG" if device == "cuda" else "MF", **found}
json.dump(out, open(path, "w"), indent=1)
for what, below, total in (("generated kernels", "below_root", "generated_kernels"),
                           ("extern ops", "region_ops_below_root", "region_ops"),
                           ("library kernels", "library_kernels_below_root", "library_kernels")):
    print(f"{what}: {out[below]} of {out[total]} below the compiled root")
print("by op name (below the root, all, distinct modules):", json.dumps(out["region_ops_by_name"]))
PY
}

p_memory() {
  python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels M,MF,MFLG \
    --iterations 3 --warmup 2 --device cuda --out /tmp/r50m 2>&1 | tail -4
  python3 - /tmp/r50m "$OUT/memory-r50-b64-train.json" <<'PY'
import json, sys
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables import memory
store = MeasurementStore(sys.argv[1])
runs = {r.levels: r.meta for r in store.runs}
layers = memory.layer_memory(store).to_pylist()
types = memory.layer_type_memory(store).to_pylist()
out = {"status": {k: (m["status"], m.get("memory_events"), m.get("api_ops")) for k, m in runs.items()},
       "layer_memory_top": layers[:8], "layer_type_memory": types, "layers": len(layers)}
json.dump(out, open(sys.argv[2], "w"), indent=1, default=str)
print(json.dumps(out["status"]), len(layers), "layers")
for row in types[:6]:
    print(row["layer_type"], row["device"], row["allocations_per_iteration"], row["allocated_bytes_per_iteration"], row["peak_allocated_bytes"])
PY
}

# The raw CUDA captures the CPU tests convert (copy them into tests/data/).
p_cuda_fixtures() {
  local levels
  for levels in MF MFLG; do
    python3 tests/record_fixture.py --device cuda --levels "$levels" --iterations 1 \
      --out "$OUT/fixtures/resnet18_train_${levels,,}_cuda_native/raw.json" 2>&1 | tail -2
  done
}

p_cuda_graphs() {
  local kind
  if [ "${FIXTURES:-1}" = 1 ]; then
    for kind in graphed eager compiled-reduce-overhead compiled-default; do
      python3 tests/record_fixture.py --cuda-graphs "$kind" --iterations 2 \
        --out "$OUT/fixtures/small_cnn_${kind//-/_}_mflg_cuda/raw.json" 2>&1 | tail -2
    done
    mkdir -p tests/data && cp -r "$OUT"/fixtures/small_cnn_* tests/data/
  fi
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -s tests/test_cuda_graphs.py \
    2>&1 | tee "$OUT/cuda-graphs-tests.log" | grep -E "^E |assert|passed|failed|Error|graphed" | head -30
  timeout 400 python3 benchmarks/cuda_graphs.py --out "$OUT/cuda-graphs.json" 2>&1 | tail -60
}

p_llama_1b() {
  large_step llama-1b --model transformers:llama-1b --mode train --batch-size 8 --fix bf16 \
    --levels M,MF,MFLG --iterations 3
}

# The 1B model's step with 4 micro-batches of gradient accumulation (over 100k spans an MFLG
# iteration): an unmodified script; a warm-up long enough to see an optimizer step.
p_llama_accum() {
  python3 benchmarks/workloads/llama_accum_train.py --steps 6 2>&1 | tail -1 | tee "$OUT/llama-accum-untraced.txt"
  large_step llama-accum --levels M,MF,MFLG --iterations 2 --warmup 9 --device cuda -- \
    python benchmarks/workloads/llama_accum_train.py --steps 14
}

# A large step's measurement (NAME, then xsp run's arguments): spans per iteration, finish µs per
# span, peak RSS, xsp analyze's time, the Jaeger trace's spans and the Perfetto export's size.
large_step() {
  local name=$1; shift
  local store=/tmp/$name-store
  rm -rf "$store"; mkdir -p "$OUT/$name"
  python3 - "$store" "$OUT/$name/rusage.json" "$@" <<'PY' 2>&1 | tail -25
import json, resource, subprocess, sys, time
store, out, arguments = sys.argv[1], sys.argv[2], sys.argv[3:]
started = time.time()
cut = arguments.index("--") if "--" in arguments else len(arguments)
done = subprocess.run([sys.executable, "-m", "xsp", "run", *arguments[:cut], "--out", store,
    *arguments[cut:]])
wall = time.time() - started
peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
json.dump({"rc": done.returncode, "wall_s": wall, "peak_rss_mb_largest_process": peak_kb / 1024}, open(out, "w"))
print(f"xsp run: rc {done.returncode}, {wall:.1f} s, peak RSS of its largest process {peak_kb / 1024:.0f} MB")
PY
  find "$store" -name run.json | while read -r meta; do
    mkdir -p "$OUT/$name/$(basename "$(dirname "$meta")")"
    cp "$meta" "$OUT/$name/$(basename "$(dirname "$meta")")/"
  done
  python3 - "$store" <<'PY' 2>&1 | tee "$OUT/$name/finish.txt"
import json, sys
from pathlib import Path
for meta in sorted(Path(sys.argv[1]).rglob("run.json")):
    m = json.loads(meta.read_text())
    ph, spans = m.get("phases_ns", {}), m.get("spans") or 0
    finish = (ph.get("converted", 0) - ph.get("measured", 0)) / 1e3
    measured = max(1, m.get("iterations_measured") or 1)
    print(f"{m['levels']}: {m['status']}, {spans} spans ({spans // measured} per iteration), "
          f"measured -> converted {finish / 1e6:.2f} s = {finish / max(spans, 1):.2f} µs per span")
PY
  python3 - "$store" "$OUT/$name" <<'PY' 2>&1 | tail -6
import resource, subprocess, sys, time
store, out = sys.argv[1], sys.argv[2]
for command in (["analyze", store, "--json"], ["summary", store]):
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "xsp", *command], capture_output=True, text=True)
    name = command[0]
    open(f"{out}/{name}.{'json' if name == 'analyze' else 'txt'}", "w").write(done.stdout)
    print(f"xsp {name}: rc {done.returncode}, {time.time() - started:.1f} s; {done.stderr[-300:]}")
print(f"peak RSS of the largest: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB")
PY
  # what the viewers get: the MFLG iteration's Jaeger trace (folded) and the Perfetto export's size
  timeout 300 python3 benchmarks/large_trace.py --store "$store" --copies 1 2>&1 \
    | grep -v "^wrote" | tee "$OUT/$name/viewers.txt"
}

p_service() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 400 python3 benchmarks/service_overhead.py --device cuda --width 2048 \
    --rounds "${ROUNDS:-12}" --requests "${REQUESTS:-1000}" --warmup 50 --sample-every 100 \
    --sampled "${SAMPLED:-MF,MFLG}" --export-every 0.5 --out "$OUT/service-overhead-cuda.json" \
    2>&1 | tail -30
}

p_cupti_attach() {
  timeout 200 python3 benchmarks/cupti_attach_cost.py --requests 1000 \
    --out "$OUT/cupti-attach-cost.json" 2>&1 | tail -25
}

p_two_streams() {
  local store="$OUT/two-streams"
  rm -rf "$store"
  timeout 200 python3 -m xsp run --levels M,MF,MFLG --iterations 20 --warmup 5 --device cuda \
    --out "$store" -- python3 benchmarks/workloads/two_streams.py --steps 50 2>&1 | tail -8
  timeout 100 python3 -m xsp analyze "$store" --json > "$OUT/two-streams-analyze.json" 2>&1
  python3 - "$OUT/two-streams-analyze.json" <<'PY'
import json, sys
replay = json.load(open(sys.argv[1]))["reconstruction"]["replay"]
print({k: replay.get(k) for k in ("step_ms", "measured_step_ms", "error_pct", "checks")})
PY
}

p_ddp_gloo() {
  mkdir -p "$OUT/ddp-gloo"
  for round in $(seq 1 "${ROUNDS:-3}"); do
    local store="$OUT/ddp-gloo/round-$round"
    rm -rf "$store"
    timeout 150 python3 -m xsp run --levels M,MF --iterations 40 --warmup 15 --device cpu \
      --out "$store" -- python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      benchmarks/workloads/ddp_gloo_straggler.py --steps 100 2>&1 | grep -E "│ (M|MF) "
    timeout 100 python3 -m xsp analyze "$store" --json > "$store-analyze.json" 2>&1
    python3 - "$store-analyze.json" <<'PY'
import json, sys
replay = json.load(open(sys.argv[1]))["reconstruction"]["replay"]
print({k: replay.get(k) for k in ("step_ms", "measured_step_ms", "error_pct", "checks")},
      "calibration", {k: replay["calibration"].get(k) for k in ("framework_ns_per_record", "scaled_to_own_steps")},
      "baseline", {k: (replay["baseline"] or {}).get(k) for k in ("untraced_ms", "difference_pct", "stable")},
      "waits ms (median)", replay["median_collective_wait_ms"])
rows = json.load(open(sys.argv[1]))["analyses"].get("suggestions", {}).get("rows", [])
for row in rows:
    if row["rule"] == "straggler":
        print("straggler:", row["evidence"], "| gain", round(row["gain_ms_per_iteration"], 3), "ms |", row["estimate"])
PY
  done
  # the straggler suggestion's fix, measured: M alone, unbalanced and --balanced alternating
  for pair in $(seq 1 "${PAIRS:-3}"); do
    for mode in straggler balanced; do
      local flag=""; [ "$mode" = balanced ] && flag=--balanced
      rm -rf "/tmp/ddp-$mode"
      timeout 120 python3 -m xsp run --levels M --iterations 40 --warmup 15 --device cpu \
        --out "/tmp/ddp-$mode" -- python3 -m torch.distributed.run --standalone \
        --nproc-per-node 2 benchmarks/workloads/ddp_gloo_straggler.py --steps 60 $flag 2>&1 \
        | grep -E "│ M " | sed "s/^/pair $pair $mode /" | tee -a "$OUT/ddp-gloo/balanced.txt"
    done
  done
  (cd "$OUT/ddp-gloo" && tar -czf ../ddp-gloo-stores.tgz round-*/ && rm -rf round-*/)
}

p_fork_run() {
  timeout 260 python3 benchmarks/fork_server_run.py --model torchvision:resnet50 --mode infer \
    --batch-size 1 --device cuda --rounds "${ROUNDS:-2}" --configs shared,forked,serial,fresh \
    --out "$OUT/fork-run-r50-b1-infer.json"
  timeout 200 python3 benchmarks/fork_server_run.py --model torchvision:resnet50 --mode train \
    --batch-size 64 --device cuda --rounds 1 --configs shared,forked,serial,fresh \
    --out "$OUT/fork-run-r50-b64-train.json"
}

p_share_run() {
  local case model mode batch
  for case in torchvision:resnet50/infer/1 timm:mobilenetv3_large_100/infer/1 \
    torchvision:resnet50/train/64; do
    IFS=/ read -r model mode batch <<<"$case"
    timeout 200 python3 benchmarks/fork_server_run.py --model "$model" --mode "$mode" \
      --batch-size "$batch" --device cuda --rounds "${ROUNDS:-3}" --configs shared,forked \
      --out "$OUT/share-run-${model#*:}-b$batch-$mode.json"
  done
}

p_calibration() {
  timeout 240 python3 benchmarks/calibration_spread.py --device cuda --repeats "${REPEATS:-10}" \
    --configs "${CONFIGS:-20x5,50x7,25x5,20x4,10x7}" --out "$OUT/calibration-spread.json" 2>&1 \
    | grep -v '^repeat'
}

p_first_step() {
  python3 benchmarks/first_step.py --rounds "${ROUNDS:-3}" --model torchvision:resnet50 \
    --batch-size 1 2>&1 | tee "$OUT/first-step.jsonl"
}

p_cold_start() {
  python3 - "$OUT/cold-start.json" "${BYTECODE_ROUNDS:-3}" <<'PY'
import json, os, subprocess, sys, time
rows = []
# the untraced loop, as a user's script would run it: the zoo's model and step, no xsp session
UNTRACED = """
import torch
from xsp.tracer.workloads import zoo
w = zoo.build("torchvision:resnet50", 64, "train", "cuda")
for _ in range(42):  # xsp run's 2 warm-up iterations and 40 measured
    w.step()
    torch.cuda.synchronize()
"""
env = dict(os.environ)  # later: Python's bytecode cached, as a pip install has it
def untraced():
    began = time.time()
    done = subprocess.run([sys.executable, "-c", UNTRACED], capture_output=True, text=True, env=env)
    rows.append({"levels": "untraced", "rc": done.returncode, "wall_s": round(time.time() - began, 2),
                 "bytecode": "PYTHONPYCACHEPREFIX" in env})
    print(rows[-1], done.stderr[-300:] if done.returncode else "")
def traced(levels):
    out = f"/tmp/cold-{len(rows)}"
    began = time.time()
    done = subprocess.run([sys.executable, "-m", "xsp", "run", "--model", "torchvision:resnet50",
        "--mode", "train", "--batch-size", "64", "--iterations", "40", "--levels", levels,
        "--device", "cuda", "--out", out], capture_output=True, text=True, env=env)
    wall = time.time() - began
    manifest = json.load(open(f"{out}/manifest.json"))
    phases = [e.get("seconds") for e in manifest.get("runs", manifest.get("level_sets", []))]
    switch_on = {}  # its parts: calibration, monitor, each level's start
    for name in levels.split(","):
        try:
            switch_on[name] = json.load(open(f"{out}/{name}/run.json")).get("switch_on_ms")
        except OSError:
            pass
    # the measurement as the manifest counts it (created to finished); the rest of the wall is
    # the runner's own start-up and its summary
    inside = (manifest.get("finished_ns", 0) - manifest.get("created_ns", 0)) / 1e9
    rows.append({"levels": levels, "rc": done.returncode, "wall_s": round(wall, 2),
                 "manifest_s": round(inside, 2), "runner_s": manifest.get("runner_s"),
                 "phases_s": phases, "switch_on_ms": switch_on,
                 "bytecode": "PYTHONPYCACHEPREFIX" in env, "out": out})
    print(levels, done.returncode, f"{wall:.1f} s ({inside:.1f} s in the manifest)", phases,
          manifest.get("runner_s"), switch_on, done.stderr[-300:] if done.returncode else "")
for levels in ("MFLG", "MFLG", "M"):
    traced(levels)
untraced()
untraced()
traced("MFLG")  # a later one, after the untraced loops
untraced()
# The image writes no bytecode (PYTHONDONTWRITEBYTECODE), so each of its processes compiles
# torch's and numpy's sources on import; a pip install has them compiled. Rounds of the untraced
# loop and a later MFLG with the bytecode cached (written by one of each first, not counted).
env.pop("PYTHONDONTWRITEBYTECODE", None)
env["PYTHONPYCACHEPREFIX"] = "/tmp/pyc-cold"
untraced(); traced("MFLG"); del rows[-2:]
for _ in range(int(sys.argv[2])):
    untraced()
    traced("MFLG")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
  # the last MFLG store, for the summary's and the fit's costs on the dev machine
  last=$(python3 -c "import json, sys; print([r['out'] for r in json.load(open(sys.argv[1])) if r['levels'] == 'MFLG'][-1])" "$OUT/cold-start.json")
  tar -czf "$OUT/cold-mflg.tgz" -C "$last" .
}

p_cpu_demo() {
  python3 - "$OUT/cpu-demo.json" "${PAIRS:-3}" <<'PY'
import json, os, statistics, subprocess, sys
import pyarrow.compute as pc
from xsp.analysis.measurement.store import MeasurementStore
rows = []
def medians(out):
    store = MeasurementStore(out)
    found = {}
    for index, run in enumerate(store.runs):
        spans = store.run_spans(index)
        steps = spans.filter(pc.equal(spans.column("kind").cast("string"), "step"))
        found[run.levels] = round(statistics.median(steps.column("dur_ns").to_pylist()) / 1e6, 2)
    return found
def once(cores, steady):
    out = "/tmp/cpu-demo"
    subprocess.run(["rm", "-rf", out])
    env = {**os.environ, "XSP_STEADY_HEAP": steady}
    done = subprocess.run(["taskset", "-c", cores, sys.executable, "-m", "xsp", "run", "--model",
        "torchvision:resnet18", "--batch-size", "2", "--iterations", "3", "--levels", "M,MF",
        "--device", "cpu", "--out", out], capture_output=True, text=True, env=env)
    row = {"cores": cores, "steady_heap": steady, "rc": done.returncode, "median_ms": medians(out)}
    rows.append(row)
    print(row, flush=True)
for _ in range(int(sys.argv[2])):
    for steady in ("1", "0"):
        once(os.environ.get("CORES", "2,3"), steady)
for steady in ("1", "0"):
    once(os.environ.get("WIDE", "2-9"), steady)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
}

p_parent_imports() {
  rm -rf /tmp/pi
  python3 -X importtime -m xsp run --model torchvision:resnet18 --batch-size 8 --levels M \
    --iterations 3 --device cuda --out /tmp/pi 2> "$OUT/parent-importtime.txt" >/dev/null
  # importtime prints a module once it is imported: the lines after torch's own, less indented,
  # are the modules that brought it in
  awk '/\| +torch$/ {n = 1} n && n++ <= 25' "$OUT/parent-importtime.txt" \
    | tee "$OUT/parent-imports.txt"
  grep -c "import time" "$OUT/parent-importtime.txt"
}

# Where xsp run's own process spends the seconds outside its level sets (issue 31): its start-up
# (xsp run --help), and the summary it prints at the end (xsp summary of an MFLG store), each
# twice as the image runs Python (no bytecode written) and twice with bytecode cached, as a
# machine where pip compiled the packages runs it; the summary's imports (python -X importtime).
p_runner_cost() {
  rm -rf /tmp/rc
  timed() { local began; began=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(python3 -c "import time; print(round(time.time() - $began, 2))") s: ${*: -3}"; }
  python3 -m xsp run --model torchvision:resnet50 --batch-size 64 --mode train --levels MFLG \
    --iterations 10 --device cuda --out /tmp/rc 2>&1 | tail -1
  python3 - <<'PY'
import json
m = json.load(open("/tmp/rc/manifest.json"))
print("manifest seconds:", round((m["finished_ns"] - m["created_ns"]) / 1e9, 2))
PY
  {
    echo "## as the image runs Python (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})"
    for _ in 1 2; do timed python3 -m xsp run --help; timed python3 -m xsp summary /tmp/rc; done
    echo "## with bytecode cached (PYTHONPYCACHEPREFIX=/tmp/pyc; the first run writes it)"
    for _ in 1 2 3; do
      timed env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m xsp run --help
      timed env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m xsp summary /tmp/rc
      # a committed store whose replay fits its calibration (benchmarks/README)
      timed env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m xsp summary \
        benchmarks/data/replay-h200/r50-b64-train-cl
    done
  } 2>&1 | tee "$OUT/runner-cost.txt"
  python3 -X importtime -m xsp summary /tmp/rc 2> "$OUT/summary-importtime.txt" >/dev/null
  sort -t'|' -k2 -n -r "$OUT/summary-importtime.txt" | head -15
  # where the summary's own seconds go, bytecode cached (the fresh store's, and the committed
  # one's, whose fit is kept), and numpy's import (0.30 s here without bytecode, 0.03 s on the
  # dev machine) with its BLAS's threads limited and not
  for store in /tmp/rc benchmarks/data/replay-h200/r50-b64-train-cl; do
    name=$(basename "$store")
    env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m cProfile \
      -o "$OUT/summary-$name.prof" -m xsp summary "$store" >/dev/null 2>&1
    python3 -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(45)" \
      "$OUT/summary-$name.prof" > "$OUT/summary-profile-$name.txt"
  done
  head -40 "$OUT/summary-profile-r50-b64-train-cl.txt" | tail -28
  {
    for threads in "" 1 "" 1; do
      echo "OPENBLAS_NUM_THREADS=${threads:-unset}: $(OPENBLAS_NUM_THREADS=$threads python3 -X importtime -c 'import numpy' 2>&1 | tail -1)"
    done
    python3 -c "import numpy; numpy.show_config()" 2>&1 | head -40
  } 2>&1 | tee "$OUT/numpy-import.txt"
}

p_conversion() {
  python3 benchmarks/conversion.py 2>&1 | tee "$OUT/conversion.txt"
}

p_collector() {
  python3 benchmarks/collector_load.py --seconds "${LOAD_S:-10}" --clients "${CLIENTS:-2}" 2>&1 \
    | tee "$OUT/collector-load.txt"
}

p_analyze() {
  python3 benchmarks/analyze.py --repeats "${REPEATS:-5}" 2>&1 | tee "$OUT/analyze.txt"
}

# --- main -------------------------------------------------------------------------------------

local_run=0
case "${1:-}" in
  "" ) usage >&2; exit 2 ;;
  -h | --help ) usage; exit 0 ;;
  -l | --list ) list; exit 0 ;;
  --local ) local_run=1; shift ;;
esac
[ $# -gt 0 ] || { usage >&2; exit 2; }
for preset in "$@"; do
  known "$preset" || { echo "device.sh: no preset '$preset'" >&2; usage >&2; exit 2; }
done

cd "$(dirname "$0")/.." || exit 1
export XSP_BENCH_LOCAL=$local_run
# shellcheck source=benchmarks/device_setup.sh
source benchmarks/device_setup.sh
status=0
for preset in "$@"; do
  echo "=== $preset"
  began=$SECONDS
  "p_${preset//-/_}" || status=1
  echo "=== $preset: $((SECONDS - began)) s"
done
exit $status
