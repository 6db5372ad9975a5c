"""What xsp adds to the latency of a batch-1 inference service (issue 28's first figure: level M
on every request, against the untraced service, at most 1%).

Method: the demo service (examples/serving/server.py, an OpenTelemetry-instrumented aiohttp
server; its request spans go to an `xsp collector serve` started here, as a service's go to its
collector) runs once per (round, configuration) in a fresh process: untraced (`python server.py`)
or under `xsp run --levels LEVELS --iterations REQUESTS+1 --warmup WARMUP`, so that every timed
request is a measured iteration. Each round runs the configurations in a freshly shuffled order.
The load client (examples/serving/load.py) sends WARMUP requests (not timed), then REQUESTS one
at a time (batch 1, no queueing), timing each from send to the whole answer, then one tail
request. The tail is the last measured one: until sessions export in the background (issue 28,
item 3), xsp converts, stores and sends the run right after its model call, inside that request,
so its latency is reported apart (and every configuration sends one).

Reported per configuration: mean, p50 and p99 latency over all rounds' timed requests, and the
added latency: the median over rounds of (this configuration's mean / the same round's untraced
mean - 1), with its min-max spread across rounds, and the same for p50; the tail request's
latency, median over rounds.

    python benchmarks/serving_overhead.py [--rounds 5] [--requests 60] [--warmup 10] \\
        [--model torchvision:resnet18] [--threads 1] [--configs untraced,M] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.serving.load import Result, run_load  # noqa: E402
from tests.fixtures import free_ports, start_collector  # noqa: E402

SERVER = ROOT / "examples/serving/server.py"
UNTRACED = "untraced"
STOP_S = 600


def _command(
    config: str, model: str, threads: int, port: int, warmup: int, requests: int, out: Path
) -> list[str]:
    serve = [str(SERVER), "--model", model, "--threads", str(threads), "--port", str(port)]
    serve += ["--max-requests", str(warmup + requests + 1)]  # it stops once the load is answered
    if config == UNTRACED:
        return [sys.executable, *serve]
    xsp_run = ["-m", "xsp", "run", "--levels", config, "--device", "cpu", "--out", str(out)]
    # the last measured request, the tail, is followed by the session's finish (conversion,
    # store, OTLP): every timed request is measured, and none of them holds the finish
    counts = ["--iterations", str(requests + 1), "--warmup", str(warmup)]
    return [sys.executable, *xsp_run, *counts, "--", "python", *serve]


def _serve_once(
    config: str, model: str, threads: int, warmup: int, requests: int, collector: str, work: Path
) -> tuple[Result, float]:
    """One fresh service process under ``config``: its warm-up, its timed requests, then its
    tail request (ms)."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
    }
    out = work / f"{config}-{port}"
    service = subprocess.Popen(
        _command(config, model, threads, port, warmup, requests, out),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        untimed = asyncio.run(run_load(url, warmup, concurrency=1, wait_s=STOP_S))
        timed = asyncio.run(run_load(url, requests, concurrency=1, wait_s=STOP_S))
        tail = asyncio.run(run_load(url, 1, concurrency=1, wait_s=STOP_S))
        _, errors = service.communicate(timeout=STOP_S)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    failures = untimed.failures + timed.failures + tail.failures
    if service.returncode != 0 or failures:
        raise SystemExit(f"{config}: exit {service.returncode}, {failures[:3]}\n{errors[-2000:]}")
    return timed, tail.latencies_ms[0]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--model", default="torchvision:resnet18")
    # one intra-op thread, as batch-1 service workers often run: on a shared host, OpenMP's
    # barriers make a two-thread forward's latency swing with other processes' load
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--configs", default=f"{UNTRACED},M")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if UNTRACED not in configs:
        parser.error(f"--configs must include {UNTRACED}: the figures are relative to it")
    order = random.Random(args.seed)
    latencies: dict[str, list[float]] = {c: [] for c in configs}
    round_means: dict[str, list[float]] = {c: [] for c in configs}
    round_p50s: dict[str, list[float]] = {c: [] for c in configs}
    tails: dict[str, list[float]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (collector_port,) = free_ports(1)
        collector = start_collector(work / "store", collector_port)
        try:
            for r in range(args.rounds):
                shuffled = order.sample(configs, len(configs))
                for config in shuffled:
                    result, tail = _serve_once(
                        config,
                        args.model,
                        args.threads,
                        args.warmup,
                        args.requests,
                        f"http://127.0.0.1:{collector_port}",
                        work,
                    )
                    latencies[config] += result.latencies_ms
                    round_means[config].append(statistics.fmean(result.latencies_ms))
                    round_p50s[config].append(result.percentile(50))
                    tails[config].append(tail)
                    print(
                        f"round {r + 1}/{args.rounds} {config}: mean "
                        f"{round_means[config][-1]:.2f} ms, p50 {round_p50s[config][-1]:.2f} ms, "
                        f"tail {tail:.2f} ms",
                        flush=True,
                    )
        finally:
            collector.terminate()
            collector.wait(timeout=60)
    figures: dict[str, Any] = {
        "model": args.model,
        "batch_size": 1,
        "device": "cpu",
        "threads": args.threads,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "warmup_per_round": args.warmup,
        "cpus": os.cpu_count(),
        "configs": {},
    }
    print(
        f"\n{args.model} b1 on CPU, {args.rounds} rounds x {args.requests} requests, one at a time"
    )
    print(
        f"{'config':10} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'tail ms':>9}"
        f" {'added (mean)':>22} {'added (p50)':>22}"
    )
    for config in configs:
        pooled = Result(latencies_ms=latencies[config]).summary()
        entry: dict[str, Any] = {k: pooled[k] for k in ("mean_ms", "p50_ms", "p99_ms")}
        added = ""
        if config != UNTRACED:
            by_mean = [
                (m / u - 1) * 100
                for m, u in zip(round_means[config], round_means[UNTRACED], strict=True)
            ]
            by_p50 = [
                (m / u - 1) * 100
                for m, u in zip(round_p50s[config], round_p50s[UNTRACED], strict=True)
            ]
            entry["added_mean_pct"] = _spread(by_mean)
            entry["added_p50_pct"] = _spread(by_p50)
            added = "".join(
                f" {s['median']:+7.2f}% [{s['min']:+.1f}, {s['max']:+.1f}]"
                for s in (entry["added_mean_pct"], entry["added_p50_pct"])
            )
        entry["round_means_ms"] = round_means[config]
        entry["tail_ms"] = tails[config]
        figures["configs"][config] = entry
        print(
            f"{config:10} {entry['mean_ms']:9.2f} {entry['p50_ms']:9.2f} {entry['p99_ms']:9.2f}"
            f" {statistics.median(tails[config]):9.2f}{added}"
        )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
