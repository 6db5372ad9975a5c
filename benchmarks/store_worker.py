"""The collector's store worker alone: µs of CPU a span, native span decoder against numpy's.

Builds the segments ``collector_load.py`` sends (real ResNet-18 training spans, 1,000 a
request, 100 requests a segment, every request's trace id its own), then stores them with
``store_worker.store_requests`` into a fresh store, the decoders alternating segment by segment
(``XSP_NATIVE_COLUMNS`` on / off), and reports each one's µs a span over the rounds: the whole
store (parse, decode, de-duplicate, write parquet) and the decode alone
(``writer.convert_together`` of the parsed requests).

    python benchmarks/store_worker.py [--rounds 5] [--requests 100] [--resources N]
        [--decoders native,numpy]

``--resources N`` sends each request's spans from N resources new to the store (as
``collector_load.py --resources N``: the many-senders case) and reports spans a second too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.collector_load import SENDER, requests  # noqa: E402
from xsp.collector import span_columns, writer  # noqa: E402
from xsp.collector.store_worker import store_requests  # noqa: E402
from xsp.core.otlp import columns as otlp_columns  # noqa: E402

TEMPLATES = 64
SPANS_PER_REQUEST = 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100, help="requests a segment")
    parser.add_argument(
        "--resources", type=int, default=1, help="distinct resources in each request (all new)"
    )
    parser.add_argument("--decoders", default="native,numpy", help="which decoders to alternate")
    args = parser.parse_args()
    if span_columns._native() is None:
        sys.exit("store_worker.py: the native span decoder cannot be built here (see the log)")
    bodies = requests(TEMPLATES, SPANS_PER_REQUEST, args.resources)
    sent = 0

    def segment() -> list[bytes]:
        nonlocal sent
        out = []
        for _ in range(args.requests):
            template = sent % TEMPLATES
            marker = template.to_bytes(16, "big")
            body = bodies[template].replace(marker, (1 << 64 | sent).to_bytes(16, "big"))
            out.append(body.replace(SENDER, f"{sent:012d}".encode()))
            sent += 1
        return out

    switches = {"native": "1", "numpy": "0"}  # XSP_NATIVE_COLUMNS
    decoders = {name: switches[name] for name in args.decoders.split(",")}
    spans = args.requests * SPANS_PER_REQUEST
    whole: dict[str, list[float]] = {name: [] for name in decoders}
    decode: dict[str, list[float]] = {name: [] for name in decoders}
    with tempfile.TemporaryDirectory() as tmp:
        store = writer.StoreWriter(Path(tmp))
        store_requests(store, "warm", segment()[:10])
        for k in range(args.rounds):
            for name, switch in decoders.items():
                os.environ["XSP_NATIVE_COLUMNS"] = switch
                span_columns._native.cache_clear()
                payloads = segment()
                parsed = [otlp_columns.parse_request(p) for p in payloads]
                t0 = time.process_time()
                writer.convert_together(parsed)
                t1 = time.process_time()
                store_requests(store, f"{name}-{k}", payloads)
                t2 = time.process_time()
                decode[name].append((t1 - t0) / spans * 1e6)
                whole[name].append((t2 - t1) / spans * 1e6)
    senders = f", {args.resources} new resources a request" if args.resources > 1 else ""
    print(f"{args.rounds} rounds, {spans:,} spans a segment{senders}, CPU time (process_time)")
    for name in decoders:
        store_us = statistics.median(whole[name])
        print(
            f"{name}: store {store_us:.2f} µs/span "
            f"({min(whole[name]):.2f}-{max(whole[name]):.2f}, {1e6 / store_us:,.0f} spans/s), "
            f"decode alone {statistics.median(decode[name]):.2f} "
            f"({min(decode[name]):.2f}-{max(decode[name]):.2f})"
        )


if __name__ == "__main__":
    main()
