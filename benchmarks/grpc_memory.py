"""Memory under concurrent large OTLP/gRPC requests: the collector's peak RSS, and what it answers.

Starts ``xsp collector serve`` in its own process (HTTP and gRPC on loopback, the default 32 MiB
request limit), then sends REQUESTS Export calls at once, each a valid OTLP request of about
SIZE_MIB (one span whose attribute holds the bulk, a fresh trace id each), and reports the
receivers' process's resident memory before, at its peak (VmHWM) and after, and how many calls
got each status. The issue's case: 100 concurrent 31 MiB requests took it from 148 to 2,088 MiB.

    python benchmarks/grpc_memory.py [--requests 100] [--size-mib 31]
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures import free_ports, start_collector  # noqa: E402

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def request(index: int, size_mib: float) -> bytes:
    export = trace_service_pb2.ExportTraceServiceRequest()
    resource_spans = export.resource_spans.add()
    kv = resource_spans.resource.attributes.add(key="service.name")
    kv.value.string_value = "grpc-memory"
    span = resource_spans.scope_spans.add().spans.add()
    span.trace_id = index.to_bytes(16, "big")
    span.span_id = (index + 1).to_bytes(8, "big")
    span.name = "bulk"
    span.start_time_unix_nano, span.end_time_unix_nano = 1_000_000_000, 1_000_001_000
    span.kind = trace_pb2.Span.SPAN_KIND_INTERNAL
    span.attributes.append(
        common_pb2.KeyValue(
            key="bulk", value=common_pb2.AnyValue(string_value="x" * int(size_mib * 2**20))
        )
    )
    return export.SerializeToString()


def memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--size-mib", type=float, default=31)
    args = parser.parse_args()
    http_port, grpc_port = free_ports(2)
    with tempfile.TemporaryDirectory() as store:
        proc = start_collector(Path(store), http_port, grpc_port)
        try:
            time.sleep(1)
            before = memory_mib(proc.pid)
            channel = grpc.insecure_channel(
                f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", 2**30)]
            )
            export = channel.unary_unary(METHOD)
            bodies = [request(i, args.size_mib) for i in range(args.requests)]

            def send(body: bytes) -> str:
                try:
                    export(body, timeout=120)
                    return "OK"
                except grpc.RpcError as exc:
                    return exc.code().name

            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=args.requests) as pool:
                codes = collections.Counter(pool.map(send, bodies))
            took = time.monotonic() - started
            time.sleep(2)
            after = memory_mib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    print(
        f"{args.requests} concurrent gRPC requests of {args.size_mib:g} MiB in {took:.1f} s: "
        f"{dict(codes)}; receivers' RSS {before['VmRSS']:.0f} MiB before, peak "
        f"{after['VmHWM']:.0f} MiB, {after['VmRSS']:.0f} MiB after"
    )


if __name__ == "__main__":
    main()
