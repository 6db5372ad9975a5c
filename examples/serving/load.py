"""A bounded load for the demo service: N predictions, at most C in flight, then the latency
figures (mean, p50, p99, in milliseconds). It waits for the service's /healthz first, sends one
random image (the size GET /info gives) per request, and exits 1 if any request failed.

    python examples/serving/load.py --url http://127.0.0.1:8000 --requests 100 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_REQUESTS = 100
DEFAULT_CONCURRENCY = 4
DEFAULT_WAIT_S = 120.0
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Result:
    latencies_ms: list[float] = field(default_factory=list)  # of the successful requests
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (nearest rank) of the latencies."""
        ordered = sorted(self.latencies_ms)
        rank = max(1, round(q / 100 * len(ordered)))
        return ordered[rank - 1]

    def summary(self) -> dict[str, float | int]:
        done = len(self.latencies_ms)
        figures: dict[str, float | int] = {"requests": done, "failed": len(self.failures)}
        if done:
            figures |= {
                "mean_ms": statistics.fmean(self.latencies_ms),
                "p50_ms": self.percentile(50),
                "p99_ms": self.percentile(99),
                "throughput_rps": done / self.wall_s if self.wall_s else 0.0,
            }
        return figures


async def wait_ready(session: aiohttp.ClientSession, url: str, wait_s: float) -> dict[str, object]:
    """The service's /info once its /healthz answers; SystemExit after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            async with session.get(f"{url}/healthz") as health:
                if health.status == 200:
                    async with session.get(f"{url}/info") as info:
                        info.raise_for_status()
                        return dict(await info.json())
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"load: {url} did not answer /healthz within {wait_s:g} s")
        await asyncio.sleep(0.2)


async def run_load(
    url: str,
    requests: int,
    concurrency: int,
    wait_s: float = DEFAULT_WAIT_S,
    headers: dict[str, str] | None = None,
    seed: int = 0,
) -> Result:
    """Send ``requests`` predictions, ``concurrency`` at a time, and time each from send to the
    whole answer."""
    url = url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        info = await wait_ready(session, url, wait_s)
        size = int(str(info["input_bytes"]))
        image = random.Random(seed).randbytes(size)
        result = Result()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                start = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/predict", data=image, headers=headers
                    ) as answer:
                        body = await answer.read()
                        if answer.status != 200:
                            text = body.decode(errors="replace").strip()
                            result.failures.append(f"request {i}: HTTP {answer.status} {text}")
                            continue
                except (TimeoutError, aiohttp.ClientError) as exc:
                    result.failures.append(f"request {i}: {type(exc).__name__}: {exc}")
                    continue
                result.latencies_ms.append((time.perf_counter() - start) * 1e3)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
        result.wall_s = time.perf_counter() - began
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, help="seconds for /healthz")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be at least 1")
    result = asyncio.run(run_load(args.url, args.requests, args.concurrency, args.wait))
    figures = result.summary()
    for failure in result.failures[:5]:
        print(f"load: {failure}", file=sys.stderr)
    if args.json:
        print(json.dumps(figures))
    elif result.latencies_ms:
        print(
            f"{figures['requests']} requests ({args.concurrency} at a time, "
            f"{figures['throughput_rps']:.1f}/s): mean {figures['mean_ms']:.2f} ms, "
            f"p50 {figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms"
            + (f", {len(result.failures)} failed" if result.failures else "")
        )
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
