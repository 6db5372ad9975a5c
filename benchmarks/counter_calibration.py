"""Calibrate the hardware-counter level against kernels whose work is known (GPU, Nsight Compute).

    python benchmarks/counter_calibration.py --out DIR        # on the H200: ncu on PATH

Runs GEMMs of known shape (fp32 on CUDA cores, TF32, BF16 and FP16 on tensor cores) and a large
copy kernel under ``ncu`` with the metrics, flags and parser the counter run (level set MH)
uses (``xsp.tracer.run.ncu``, ``xsp.tracer.convert.ncu``), and compares what the counters say
with what the kernels must do: 2·M·N·K FLOPs per GEMM, in its precision (a BF16 GEMM counts no
FP32 FMAs beyond its epilogue's one per output), and the copy's bytes read and written. Before
the profiled window it also times the peaks the counter run measures (``measure_peaks``).
A GEMM whose precision has no tensor-core metric on the device (fp16 on the H200 under ncu
2025.3) is reported as not measurable there, not as a failure. Writes
``DIR/counter-calibration.json`` (commit it as
``benchmarks/results/counter-calibration-h200.json``), the raw CSV, ncu's log, and a table.

Each case runs inside its own NVTX start/end range ``xsp::step::<case index>``, so the parser's
iteration column says which case a kernel belongs to; every kernel of a case is summed (cuBLAS
may add a reduction kernel to a GEMM).

A device-to-device ``cudaMemcpy`` runs on the copy engines, not as a kernel, so ncu profiles
none; the copy case is an elementwise kernel that reads and writes the same bytes (2 GiB each
way, 40 times the 50 MB L2, so at most 2.4% of the writes can still sit in L2 at its end).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (case, dtype, M, N, K): every size a multiple of the tensor cores' tiles (no padded work).
GEMMS = (
    ("gemm_fp32", "fp32", 4096, 3072, 2048),
    ("gemm_tf32", "tf32", 8192, 4096, 6144),
    ("gemm_bf16", "bf16", 8192, 4096, 6144),
    ("gemm_fp16", "fp16", 8192, 4096, 6144),
)
COPY_BYTES = 2 << 30
CASES = [*(g[0] for g in GEMMS), "copy"]
#: Acceptance: FLOPs within 1% for the GEMMs, bytes within 5% for the copy.
FLOPS_TOLERANCE = 0.01
BYTES_TOLERANCE = 0.05
FFMA = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"


def worker(timing_path: Path) -> None:
    """Under ncu: time the peaks (unprofiled), then run each case once inside its range."""
    import torch

    from xsp.core.records import STEP_RANGE_PREFIX
    from xsp.tracer.capture.levels.counters import measure_peaks

    device = "cuda"
    started = time.perf_counter()
    peaks = measure_peaks(device)
    timing = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "peaks_measured": peaks,
        "peaks_s": round(time.perf_counter() - started, 3),
    }
    timing_path.write_text(json.dumps(timing, indent=1))
    dtypes = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
    }
    work: list[tuple[str, str, Callable[[], Any]]] = []
    for case, dtype, m, n, k in GEMMS:
        a = torch.randn(m, k, device=device, dtype=dtypes[dtype])
        b = torch.randn(k, n, device=device, dtype=dtypes[dtype])
        out = torch.empty(m, n, device=device, dtype=dtypes[dtype])
        work.append((case, dtype, functools.partial(torch.mm, a, b, out=out)))
    source = torch.empty(COPY_BYTES // 4, device=device, dtype=torch.float32).uniform_()
    target = torch.empty_like(source)
    work.append(("copy", "fp32", lambda: torch.mul(source, 1.0, out=target)))
    matmul = torch.backends.cuda.matmul
    for _, dtype, run in work:  # warm up (cuBLAS heuristics, allocations), unprofiled
        matmul.allow_tf32 = dtype == "tf32"
        run()
    torch.cuda.synchronize()
    for index, (case, dtype, run) in enumerate(work):
        assert CASES[index] == case
        matmul.allow_tf32 = dtype == "tf32"
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        handle = torch.cuda.nvtx.range_start(f"{STEP_RANGE_PREFIX}{index}")
        run()
        torch.cuda.nvtx.range_end(handle)
        torch.cuda.profiler.stop()
        torch.cuda.synchronize()


def expected(case: str) -> dict[str, Any]:
    for name, dtype, m, n, k in GEMMS:
        if name == case:
            return {
                "precision": dtype,
                "flops": 2 * m * n * k,
                "outputs": m * n,
                "shape": [m, n, k],
            }
    return {"bytes_read": COPY_BYTES, "bytes_written": COPY_BYTES}


def unmeasurable(precision: str, missing: list[str]) -> str | None:
    """Why a GEMM of ``precision`` cannot be counted on this device, or None: the tensor-core
    quantity that counts its work has no metric there (the H200 under ncu 2025.3 offers no
    ``sm__ops_path_tensor_src_fp16_*``, so fp16 GEMMs count zero)."""
    from xsp.core.counter_names import PRECISIONS

    tensor = PRECISIONS.get(precision, (None, None))[1]
    if tensor and tensor in {str(q).split("[", 1)[0] for q in missing}:
        return f"not measurable on this device: no metric for {tensor}"
    return None


def compare(rows: list[dict[str, Any]], missing: list[str] | None = None) -> list[dict[str, Any]]:
    """Per case: the counters summed over its kernels against what the case must do. A GEMM
    whose precision has no tensor-core metric on the device (``missing``, the quantities
    without one) is marked not measurable (``ok`` None) instead of failed."""
    out = []
    for index, case in enumerate(CASES):
        members = [r for r in rows if r["iteration"] == index]

        def total(name: str, members: list[dict[str, Any]] = members) -> float:
            return float(sum(r.get(name) or 0.0 for r in members))

        want = expected(case)
        result: dict[str, Any] = {
            "case": case,
            "kernels": [r["kernel"] for r in members],
            "expected": want,
            "counted": {
                name: total(name)
                for name in (
                    "flops_fp64",
                    "flops_fp32",
                    "flops_tf32",
                    "flops_fp16",
                    "flops_bf16",
                    "flops_fp8",
                    "tensor_flops",
                    "flops",
                    "dram_read_bytes",
                    "dram_write_bytes",
                    "l2_bytes",
                )
            },
            "ncu_duration_ns": total("ncu_duration_ns"),
        }
        if "flops" in want:
            counted = total(f"flops_{want['precision']}")
            result["flops_ratio"] = counted / want["flops"]
            result["other_precision_flops"] = total("flops") - counted
            result["fp32_ffma_per_output"] = total(FFMA) / want["outputs"]
            result["ok"] = abs(result["flops_ratio"] - 1) <= FLOPS_TOLERANCE
            reason = unmeasurable(want["precision"], missing or [])
            if reason and not counted:
                result["ok"] = None
                result["not_measurable"] = reason
        else:
            moved = total("dram_read_bytes") + total("dram_write_bytes")
            result["dram_bytes_ratio"] = moved / (want["bytes_read"] + want["bytes_written"])
            result["dram_read_ratio"] = total("dram_read_bytes") / want["bytes_read"]
            result["dram_write_ratio"] = total("dram_write_bytes") / want["bytes_written"]
            result["ok"] = abs(result["dram_bytes_ratio"] - 1) <= BYTES_TOLERANCE
        out.append(result)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("counter-calibration"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timing", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.timing)
        return 0

    from xsp.core import store
    from xsp.tracer.convert import ncu as counters
    from xsp.tracer.run import ncu

    args.out.mkdir(parents=True, exist_ok=True)
    tool = ncu.find()
    if tool is None:
        print(f"xsp: {ncu.unavailable()}", file=sys.stderr)
        return 2
    metrics, missing, checked = ncu.selection(tool)
    timing = args.out / "calibration-timing.json"
    command = ncu.profile_command(
        tool,
        args.out,
        [sys.executable, __file__, "--worker", "--timing", str(timing)],
    )
    started = time.perf_counter()
    done = subprocess.run(command)
    profile_s = time.perf_counter() - started
    report = args.out / store.NCU_REPORT
    if done.returncode != 0 or not report.exists():
        print(f"ncu failed ({done.returncode}): {ncu.log_errors(args.out)}", file=sys.stderr)
        return 1
    text = ncu.import_csv(tool, report)
    (args.out / "calibration-raw.csv").write_text(text)
    parsed = counters.read_raw_csv(text)
    log = (args.out / store.NCU_LOG).read_text(errors="replace")
    cases = compare(parsed.table.to_pylist(), missing)
    result = {
        "tool": ncu.version(tool),
        "metrics": metrics,
        "quantities_without_metric": missing,
        "metrics_checked_against_device": checked,
        "flags": list(ncu.PROFILE_FLAGS),
        "passes": counters.pass_counts(log),
        "profile_s": round(profile_s, 1),
        "unreadable_cells": parsed.unreadable_cells,
        **json.loads(timing.read_text()),
        "cases": cases,
        "ok": all(c["ok"] for c in cases if c["ok"] is not None),
        "not_measurable": [c["case"] for c in cases if c["ok"] is None],
    }
    (args.out / "counter-calibration.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['tool']} on {result.get('device')}: {len(metrics)} metrics, passes per "
        f"kernel {sorted(set(result['passes']))}, {profile_s:.1f} s under ncu"
    )
    if missing:
        print(f"no metric on this device for: {', '.join(missing)}")
    for case in cases:
        if case["ok"] is None:
            print(f"{case['case']:10} {case['not_measurable']}")
        elif "flops_ratio" in case:
            print(
                f"{case['case']:10} {case['expected']['shape']}: counted/2MNK = "
                f"{case['flops_ratio']:.5f}; other precisions {case['other_precision_flops']:.3g}"
                f" FLOPs; FFMA per output {case['fp32_ffma_per_output']:.2f}; "
                f"{'ok' if case['ok'] else 'OFF'} ({len(case['kernels'])} kernels)"
            )
        else:
            print(
                f"{case['case']:10} {COPY_BYTES >> 30} GiB each way: DRAM read {case['dram_read_ratio']:.4f}, "
                f"written {case['dram_write_ratio']:.4f}, together {case['dram_bytes_ratio']:.4f} "
                f"of expected; {'ok' if case['ok'] else 'OFF'}"
            )
    peaks = result.get("peaks_measured") or {}
    print(
        "measured peaks: "
        + ", ".join(
            f"{k} {v / 1e12:,.1f} T{'B' if k == 'dram' else 'FLOP'}/s" for k, v in peaks.items()
        )
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
