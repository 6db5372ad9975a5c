"""What xsp's level sets cost against the uninstrumented loop, with torch.profiler alongside.

Method: one fresh process per (round, case, configuration), so that nothing one tool leaves in a
process (hooks, CUPTI, allocator state, NVTX injection) reaches another; ROUNDS rounds, each
running every configuration of a case in a freshly shuffled order. Each process builds the
workload, runs WARMUP untimed and ITERS timed iterations, and reports:

- ``step_ms``: its median iteration, timed as level M times one (device synchronization, then
  the wall clock, at both ends);
- ``end_to_end_s``: the whole loop, warm-up included, plus the tool's own finish: xsp's
  conversion and store (into a temporary run directory), torch.profiler's Chrome-trace export.
  The clock stops when that returns (until job 11 it also held this benchmark's reading the
  spans back, or counting torch.profiler's events);
- ``peak_rss_mb``: the process's peak resident memory;
- ``paired_step``: its median iteration over the median of ITERS untraced iterations that the
  same process ran first (warm-up included, before the loop above). Batch-1 steps on a shared
  host vary by up to 2x from one fresh process to the next (CPU placement and clocks); a
  process's own untraced iterations cancel that. Level L's processes set the NVTX injection
  variables before the libraries load, so their untraced iterations already route the
  libraries' NVTX calls into an idle CUPTI.

A configuration's ratio in a round is its figure over the same round's uninstrumented figure
(``paired_step``: over its own process's untraced one); we report the median ratio across rounds
with its min-max spread.

    python benchmarks/overhead.py [--device cuda] [--rounds 3] [--iters 30] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xsp.tracer.capture.hooks.cupti import LIBRARY_NVTX_ENV

CASES = (
    "torchvision:resnet50/train/64",
    "torchvision:resnet50/infer/1",
    "torchvision:mobilenet_v2/infer/1",
    "gpt-lm/train/16",
    "compiled:torchvision:resnet18/train/32",
)
#: The launch-bound model of the CPU figure (the dev machine and CI).
CPU_CASES = ("small-layers:50/infer/1", "small-layers:50/train/1")
CONFIGS = ("none", "MF", "MFLG", "torch.profiler(cpu+cuda)", "torch.profiler(full)")
FIGURES = ("step_ms", "paired_step", "end_to_end_s", "peak_rss_mb")


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def build_step(case: str, device: str) -> Callable[[], None]:
    """One training or inference step of ``case`` (``model/mode/batch``): a zoo model, the
    small GPT language model of benchmarks/workloads (bf16 autocast, AdamW, 256 tokens), or a
    zoo model under torch.compile (``compiled:<model>``)."""
    import torch

    model, mode, batch = case.rsplit("/", 2)
    if model == "gpt-lm":
        return _gpt_step(int(batch), device)
    if model.startswith("small-layers:"):
        return _small_layers_step(int(model.split(":")[1]), int(batch), mode, device)
    from xsp.tracer.workloads import zoo

    compiled = model.startswith("compiled:")
    workload = zoo.build(model.removeprefix("compiled:"), int(batch), mode, device)
    if compiled:
        workload.model = torch.compile(workload.model)  # type: ignore[assignment]
    return workload.step


def _small_layers_step(layers: int, batch: int, mode: str, device: str) -> Callable[[], None]:
    """A launch-bound model: ``layers`` × (Linear 64→64, ReLU), each its own nn.Module."""
    import torch

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(layers)]
    model = torch.nn.Sequential(*blocks).to(device)
    x = torch.randn(batch, 64, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        if mode == "infer":
            with torch.inference_mode():
                model(x)
            return
        optimizer.zero_grad(set_to_none=True)
        model(x).sum().backward()
        optimizer.step()

    return step


def _gpt_step(batch: int, device: str) -> Callable[[], None]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256, vocab_size=8192)
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, config.vocab_size, (batch, 256), device=device)
    kind = "cuda" if device.startswith("cuda") else "cpu"

    def step() -> None:
        with torch.autocast(kind, dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _timed(step: Callable[[], None], sync: Callable[[], None], iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        sync()
        t0 = time.time_ns()
        step()
        sync()
        times.append((time.time_ns() - t0) / 1e6)
    return times


def run_child(config: str, case: str, device: str, warmup: int, iters: int) -> dict[str, Any]:
    """Run one configuration of one case in this (fresh) process. An xsp configuration is a
    level set, optionally with a variant that shows where its cost goes: a CUPTI buffer size,
    ``MFLG(cupti 16MB)``; ``MF(no shapes)``; ``MF(shapes every iteration)``, not only the
    first; ``MFLG(no library ranges)``, without the cuBLAS and cuDNN NVTX ranges;
    ``MFLG(no correlation)``, without the ops' CUPTI external correlation."""
    levels, _, variant = config.partition("(")
    variant = variant.removesuffix(")")
    op_shapes = variant != "no shapes"
    if variant.startswith("cupti "):
        os.environ["XSP_CUPTI_BUFFER_MB"] = variant.split()[1].removesuffix("MB")
    if variant == "no library ranges":
        os.environ.update({key: "0" for key in LIBRARY_NVTX_ENV})  # the session only adds
    if variant == "no correlation":
        _without_correlation()
    if variant == "shapes every iteration":
        os.environ["XSP_OP_SHAPES"] = "every"
    if "L" in levels and device.startswith("cuda"):
        from xsp.tracer.capture.hooks.cupti import nvtx_environment

        os.environ.update(nvtx_environment())  # before the libraries first use NVTX
    import torch

    step = build_step(case, device)
    sync = _sync(device)
    spans, finish = 0, {}
    _timed(step, sync, warmup)
    baseline = statistics.median(_timed(step, sync, iters))
    with tempfile.TemporaryDirectory(prefix="xsp-overhead-") as tmp:
        began = time.perf_counter()
        if config == "none":
            _timed(step, sync, warmup)
            times = _timed(step, sync, iters)
            ended = time.perf_counter()
        elif config.startswith("torch.profiler"):
            _timed(step, sync, warmup)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.startswith("cuda"):
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            full = "full" in config
            with torch.profiler.profile(
                activities=activities,
                record_shapes=full,
                with_stack=full,
                profile_memory=full,
            ) as prof:
                times = _timed(step, sync, iters)
            prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
            ended = time.perf_counter()  # before this benchmark counts the events
            spans = len(prof.profiler.kineto_results.events())
        else:
            out = Path(tmp) / "run"
            times, spans, finish, ended = _xsp(levels, step, device, warmup, iters, out, op_shapes)
        end_to_end = ended - began
    result = {
        "step_ms": statistics.median(times),
        "baseline_step_ms": baseline,
        "end_to_end_s": end_to_end,
        "peak_rss_mb": finish.pop("peak_rss_mb", _peak_rss_mb()),
        "spans": spans,
    }
    if config.startswith("M"):
        result.update(finish)
    return result


def _without_correlation() -> Callable[[], None]:
    """Level L as it would be without level F in the process: no EXTERNAL_CORRELATION kind,
    so the op callback pushes nothing to CUPTI. Returns what puts it back."""
    from xsp.tracer.capture.levels import cuda

    init = cuda.LibraryLevel.__init__

    def without_ops(self: Any, with_ops: bool = False) -> None:
        init(self, with_ops=False)

    def restore() -> None:
        cuda.LibraryLevel.__init__ = init  # type: ignore[method-assign]

    cuda.LibraryLevel.__init__ = without_ops  # type: ignore[method-assign]
    return restore


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _xsp(
    levels: str,
    step: Callable[[], None],
    device: str,
    warmup: int,
    iters: int,
    out: Path,
    op_shapes: bool,
) -> tuple[list[float], int, dict[str, Any], float]:
    """Run ``levels`` over the loop; return its steps, spans, finish figures and when
    ``close()`` returned (the end of the end-to-end figure: what follows is this benchmark's
    own reading back)."""
    from xsp.core import store
    from xsp.tracer.capture.session import Session

    session = Session(
        levels, iterations=iters, warmup=warmup, out=out, device=device, op_shapes=op_shapes
    ).start()
    while not session.done:
        with session.iteration():
            step()
    meta = session.close() or {}
    ended = time.perf_counter()
    peak = _peak_rss_mb()  # before this benchmark reads the spans back
    if meta.get("status") != "ok":
        raise SystemExit(f"xsp {levels}: {meta.get('status')}: {meta.get('status_reasons')}")
    table = store.open_run(out).spans()
    kinds = table.column("kind").to_pylist()
    durations = table.column("dur_ns").to_pylist()
    steps = [d / 1e6 for d, k in zip(durations, kinds, strict=True) if k == "step"]
    phases = meta.get("phases_ns") or {}
    finish_s = (int(meta["finished_ns"]) - int(phases["measured"])) / 1e9
    finish = {
        "finish_s": finish_s,  # levels off, CUPTI flush, decode, conversion, store
        "finish_us_per_span": 1e6 * finish_s / max(table.num_rows, 1),
        "phases_s": {k: (int(v) - int(phases["measured"])) / 1e9 for k, v in phases.items()},
        "api_ops": meta.get("api_ops"),
        "cupti": meta.get("cupti"),
        "peak_rss_mb": peak,
    }
    return steps, table.num_rows, finish, ended


def _spawn(config: str, case: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", config, "--cases", case]
    command += ["--device", args.device, "--warmup", str(args.warmup), "--iters", str(args.iters)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-1500:]
        print(f"  {case} {config}: FAILED ({done.returncode}): {tail}", file=sys.stderr)
        return {"failed": tail}
    return dict(json.loads(lines[-1]))


def _summary(rounds: list[dict[str, dict[str, Any]]], configs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for config in configs:
        entry: dict[str, Any] = {}
        for figure in FIGURES:
            if figure == "paired_step":
                ran = [r[config] for r in rounds if "baseline_step_ms" in r.get(config, {})]
                ratios = [x["step_ms"] / x["baseline_step_ms"] for x in ran]
                values = [x["baseline_step_ms"] for x in ran]
            else:
                ratios = [
                    r[config][figure] / r["none"][figure]
                    for r in rounds
                    if figure in r.get(config, {}) and figure in r.get("none", {})
                ]
                values = [r[config][figure] for r in rounds if figure in r.get(config, {})]
            if ratios:
                entry[figure] = {
                    "median": statistics.median(values),
                    "ratio": statistics.median(ratios),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                }
        entry["spans"] = max((r.get(config, {}).get("spans", 0) for r in rounds), default=0)
        out[config] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="of: " + ", ".join(CONFIGS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        result = run_child(args.child, args.cases, args.device, args.warmup, args.iters)
        print(json.dumps(result))
        return
    configs = [c for c in args.configs.split(",") if c]
    if "none" not in configs:
        configs.insert(0, "none")
    import torch

    results: dict[str, Any] = {
        "method": "fresh process per (round, case, configuration); shuffled within a round; paired_step against the same process's untraced iterations",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup": args.warmup,
        "cases": {},
    }
    random.seed(0)
    for case in args.cases.split(","):
        rounds: list[dict[str, dict[str, Any]]] = []
        summary = _summary(rounds, configs)
        for index in range(args.rounds):
            order = random.sample(configs, len(configs))
            print(f"{case} round {index + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            rounds.append({config: _spawn(config, case, args) for config in order})
            summary = _summary(rounds, configs)
            results["cases"][case] = {"rounds": rounds, "summary": summary}
            if args.out:  # after every round: a job stopped by its time limit keeps the rest
                Path(args.out).write_text(json.dumps(results, indent=1))
        _print_case(case, summary)


def _print_case(case: str, summary: dict[str, Any]) -> None:
    print(f"\n{case}")
    print(f"{'configuration':<26}" + "".join(f"{f:>30}" for f in FIGURES) + f"{'spans':>10}")
    for config, entry in summary.items():
        cells = []
        for figure in FIGURES:
            f = entry.get(figure)
            cells.append(
                f"{f['median']:>9.2f} {f['ratio']:.3f}x [{f['ratio_min']:.2f}-{f['ratio_max']:.2f}]"
                if f
                else "failed"
            )
        print(f"{config:<26}" + "".join(f"{c:>30}" for c in cells) + f"{entry['spans']:>10}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
