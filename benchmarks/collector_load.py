"""Load benchmark: OTLP/HTTP protobuf into the xsp collector on this machine.

Starts ``xsp collector serve`` in its own process, then CLIENTS threads post pre-encoded requests
of SPANS_PER_REQUEST spans (real ResNet-18 training spans, a fresh trace id each) over keep-alive
connections for SECONDS (each request's trace id made unique by patching the encoded bytes, since
the collector stores a byte-identical retry once); reports acknowledged spans per second and the
store worker's rate (spans in the store's parts at the end of the load, per second of load; and
all of them once SIGTERM's flush is done, per second of load and flush) and the CPU time the
collector's processes used during the load (the receivers' process, the store worker), then stops
the collector (SIGTERM: it flushes) and checks that the store holds every acknowledged span.

    python benchmarks/collector_load.py [--seconds 10] [--clients 2] [--spans-per-request 1000]
        [--rate SPANS_PER_S]

``--rate`` offers that many spans a second in all (each client paced to its share, never ahead
of its schedule) instead of as many as the collector takes: "sustained at 200k spans/s without
a 429" is then a question this answers. The store worker's RSS (/proc VmRSS) is sampled every
``--rss-every`` seconds (default 10) and printed. ``--resources N`` sends each request's spans
from N resources new to the store (``host.name`` numbered by request): the many-senders case.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures import free_ports, load_raw, start_collector  # noqa: E402
from xsp.core.store import open_measurement  # noqa: E402
from xsp.tracer.convert.spans import build_table  # noqa: E402
from xsp.tracer.export import otlp_layout  # noqa: E402

RESOURCE = {
    "service.name": "xsp",
    "host.name": "bench",
    "xsp.measurement.id": "load",
    "xsp.levels": "MF",
}


#: With ``--resources N``, each request's spans are sent by N resources, whose ``host.name``
#: holds this placeholder, replaced by the request's number: every request's resources are new.
SENDER = b"XXXXXXXXXXXX"


def requests(count: int, spans: int, resources: int = 1) -> list[bytes]:
    steps, framework, _ = load_raw("resnet18_train_cpu")
    base = build_table("load", "MF", {"M": steps, "F": framework})[0].slice(0, spans)
    out = []
    for i in range(count):
        trace = pa.array([i.to_bytes(16, "big")] * base.num_rows, pa.binary(16))
        table = base.set_column(0, "trace_id", trace)
        if resources == 1:
            out.append(otlp_layout.encode_request(RESOURCE, table).SerializeToString())
            continue
        request = ExportTraceServiceRequest()
        share = -(-spans // resources)
        for j in range(resources):
            resource = {**RESOURCE, "host.name": f"bench-{j:05d}-{SENDER.decode()}"}
            rows = table.slice(j * share, share)
            request.resource_spans.extend(otlp_layout.encode_request(resource, rows).resource_spans)
        out.append(request.SerializeToString())
    return out


def stored_so_far(store: Path) -> int:
    """The spans in the store's parts now (a part being replaced may be missed: a lower bound)."""
    total = 0
    for part in store.glob("*/*/spans-*.parquet"):
        with contextlib.suppress(OSError, pa.ArrowInvalid):
            total += pq.ParquetFile(part).metadata.num_rows
    return total


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def rss_mib(pid: int) -> float | None:
    """A process's resident memory now (Linux /proc VmRSS), MiB; None once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def sample_rss(pid: int, every: float, stop: threading.Event, out: list[tuple[float, str]]) -> None:
    """Every ``every`` seconds until ``stop``: (seconds since start, the RSS of ``pid``'s
    children, the store worker) into ``out``."""
    start = time.perf_counter()
    while not stop.wait(every):
        rss = [rss_mib(child) for child in children(pid)]
        out.append((time.perf_counter() - start, ", ".join(f"{r:.0f}" for r in rss if r)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--spans-per-request", type=int, default=1000)
    parser.add_argument("--rate", type=float, help="spans/s offered in all (default: no limit)")
    parser.add_argument(
        "--resources", type=int, default=1, help="distinct resources in each request (all new)"
    )
    parser.add_argument("--rss-every", type=float, default=10, help="seconds between RSS samples")
    args = parser.parse_args()
    bodies = requests(64, args.spans_per_request, args.resources)
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        proc = start_collector(store, port)
        acked = [0] * args.clients
        rejected = [0] * args.clients
        deadline = time.perf_counter() + args.seconds

        # a client's time between requests at the offered rate (0: as fast as answered)
        period = args.clients * args.spans_per_request / args.rate if args.rate else 0.0

        def client(k: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            i = k
            due = time.perf_counter()
            while time.perf_counter() < deadline:
                if period:
                    due += period
                    time.sleep(max(0.0, due - time.perf_counter()))
                template = bodies[i % len(bodies)]
                marker = (i % len(bodies)).to_bytes(16, "big")
                body = template.replace(marker, (1 << 64 | i).to_bytes(16, "big"))
                if args.resources > 1:
                    body = body.replace(SENDER, f"{i:012d}".encode())
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    acked[k] += args.spans_per_request
                else:
                    rejected[k] += 1
                i += args.clients
            conn.close()

        cpu_before = {pid: cpu_seconds(pid) for pid in [proc.pid, *children(proc.pid)]}
        samples: list[tuple[float, str]] = []
        stop = threading.Event()
        sampler = threading.Thread(
            target=sample_rss, args=(proc.pid, args.rss_every, stop, samples)
        )
        sampler.start()
        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        stop.set()
        sampler.join()
        during = stored_so_far(store)
        cpu = {
            pid: cpu_seconds(pid) - cpu_before.get(pid, 0.0)
            for pid in [proc.pid, *children(proc.pid)]
        }
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
        drain = time.perf_counter() - t0
        stored = sum(r.spans().num_rows for r in open_measurement(store / "load"))
        total = sum(acked)
        offered = f", {args.rate:,.0f} spans/s offered" if args.rate else ""
        senders = f", {args.resources} new resources/request" if args.resources > 1 else ""
        print(
            f"{args.clients} clients, {args.spans_per_request} spans/request{senders}{offered}, "
            f"{elapsed:.1f} s"
        )
        print(
            f"acknowledged: {total} spans, {total / elapsed:,.0f} spans/s ({sum(rejected)} requests told to retry)"
        )
        print(f"stored during the load: {during} spans, {during / elapsed:,.0f} spans/s")
        workers = ", ".join(f"{cpu[pid]:.1f}" for pid in cpu if pid != proc.pid)
        print(
            f"CPU during the load: receivers' process {cpu[proc.pid]:.1f} s, its children "
            f"(the store worker) {workers} s, over {elapsed:.1f} s"
        )
        print(
            f"stored after SIGTERM: {stored} spans (flush after the load took {drain:.1f} s), "
            f"{stored / (elapsed + drain):,.0f} spans/s over load and flush"
        )
        print(
            "store worker RSS (MiB) over the load: "
            + "; ".join(f"{t:.0f} s {r}" for t, r in samples)
        )
        run_json = max((p.stat().st_size for p in store.glob("load/*/run.json")), default=0)
        print(f"run.json: {run_json:,} bytes")
        if stored < total:
            raise SystemExit("store lost acknowledged spans")


if __name__ == "__main__":
    main()
