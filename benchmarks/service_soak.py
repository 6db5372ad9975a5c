"""Soak: a CPU inference service traced until stopped, with sampling; memory over time and what
was stored and acknowledged (issue 28's "memory flat, every sampled request's trace stored").

The service is this process: a loop of batch-1 requests to a small MLP (one forward pass each,
a root-module-call iteration) under a continuous session (``iterations=0``): level M on every
request, level F on every ``--sample-every``-th, batches stored every ``--export-every`` seconds
into a run directory and sent over OTLP/HTTP to ``xsp collector serve`` in its own process.
Every ``--report-every`` seconds it prints the process's RSS and what is stored so far; at the
end it closes the session, stops the collector (SIGTERM: it flushes) and checks:

- every measured request has its model span in the run directory;
- every sampled request has its layer spans there (F on exactly the sampled iterations);
- the collector acknowledged every stored span and its store holds them.

    python benchmarks/service_soak.py [--seconds 150] [--sample-every 100] [--export-every 5]
        [--report-every 10] [--no-otlp]
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import xsp
from tests.fixtures import free_ports, start_collector
from xsp.core.otlp.transport import OtlpConfig, make_transport
from xsp.core.store import open_run
from xsp.tracer.export.sinks import OtlpSink


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(256, 10)).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--export-every", type=float, default=5.0)
    parser.add_argument("--report-every", type=float, default=10.0)
    parser.add_argument("--no-otlp", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    net, x = model(), torch.randn(1, 256)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run" / "MF"
        sinks, collector, otlp = [], None, None
        if not args.no_otlp:
            (port,) = free_ports(1)
            collector = start_collector(Path(tmp) / "collector", port)
            config = OtlpConfig.from_env(f"http://127.0.0.1:{port}")
            assert config is not None
            otlp = OtlpSink(make_transport(config))
            sinks.append(otlp)
        session = xsp.session(
            "MF",
            iterations=0,
            warmup=20,
            out=run_dir,
            device="cpu",
            auto_iterations=True,
            sample_every=args.sample_every,
            export_every_s=args.export_every,
            sinks=sinks,
            workload="service-soak",
        )
        served, samples = 0, []
        began = time.monotonic()
        next_report = began
        print(
            f"{'t s':>6} {'RSS MB':>8} {'requests':>9} {'batches stored':>15} {'iters stored':>13}"
        )
        with torch.inference_mode():
            while (now := time.monotonic()) - began < args.seconds:
                net(x)
                served += 1
                if now >= next_report:
                    meta = _running_meta(run_dir)
                    samples.append((now - began, rss_mb()))
                    print(
                        f"{now - began:6.0f} {samples[-1][1]:8.1f} {served:9d} "
                        f"{meta.get('batches_stored', 0):15d} {meta.get('iterations_stored', 0):13d}"
                    )
                    next_report += args.report_every
        closing = time.monotonic()
        meta = session.close() or {}
        closed_s = time.monotonic() - closing
        _report(args, run_dir, meta, served, samples, closed_s, otlp, collector, Path(tmp))


def _running_meta(run_dir: Path) -> dict:
    import json

    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def _report(args, run_dir, meta, served, samples, closed_s, otlp, collector, tmp) -> None:  # type: ignore[no-untyped-def]
    rows = open_run(run_dir).spans().select(["kind", "level", "iteration"]).to_pylist()
    steps = {r["iteration"] for r in rows if r["kind"] == "step"}
    framework = {r["iteration"] for r in rows if r["level"] == "framework"}
    measured = meta.get("iterations_measured", 0)
    expected = set(range(0, measured, args.sample_every))
    settled = [rss for t, rss in samples if t >= 30] or [s[1] for s in samples]
    print()
    print(f"requests served: {served} in {args.seconds:.0f} s ({served / args.seconds:,.0f}/s)")
    print(f"status: {meta.get('status')} {meta.get('status_reasons')}")
    print(f"measured: {measured}; model spans stored: {len(steps)}")
    print(
        f"sampled (1 in {args.sample_every}): {math.ceil(measured / args.sample_every)}; "
        f"with layer spans stored: {len(framework)}; exactly the sampled ones: {framework == expected}"
    )
    print(f"batches stored: {meta.get('batches_stored')}; spans stored: {meta.get('spans')}")
    print(f"close (the last batch stored and sent): {closed_s:.2f} s")
    print(
        f"RSS MB: first {samples[0][1]:.1f}, after 30 s min {min(settled):.1f} "
        f"max {max(settled):.1f}, last {samples[-1][1]:.1f}"
    )
    if otlp is not None and collector is not None:
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=600)
        at_collector = 0
        for run_json in (tmp / "collector").rglob("run.json"):
            at_collector += open_run(run_json.parent).spans().num_rows
        print(
            f"OTLP: spans acknowledged by the collector {otlp.spans_sent}; in its store after "
            f"its shutdown {at_collector}; stored here {meta.get('spans')}"
        )
    ok = len(steps) == measured and framework == expected
    if not ok:
        raise SystemExit("a measured or sampled request's spans are missing")


if __name__ == "__main__":
    main()
