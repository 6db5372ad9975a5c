"""``xsp collector serve``: the OTLP collector service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xsp.cli.common import console


@click.group()
def collector() -> None:
    """The OTLP collector service."""


@collector.command()
@click.option(
    "--store",
    "store_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Run store to write (created if missing).",
)
@click.option(
    "--grpc",
    "grpc_address",
    default="127.0.0.1:4317",
    show_default=True,
    help="OTLP/gRPC HOST:PORT ('' to disable).",
)
@click.option(
    "--http",
    "http_address",
    default="127.0.0.1:4318",
    show_default=True,
    help="OTLP/HTTP HOST:PORT ('' to disable).",
)
@click.option("--forward", help="Also forward every request to this OTLP endpoint (e.g. Jaeger).")
@click.option(
    "--token", envvar="XSP_COLLECTOR_TOKEN", help="Require 'Authorization: Bearer TOKEN'."
)
@click.option("--tls-cert", type=click.Path(exists=True, path_type=Path))
@click.option("--tls-key", type=click.Path(exists=True, path_type=Path))
@click.option("--max-request-mib", type=float, default=32, show_default=True)
def serve(
    store_dir: Path,
    grpc_address: str,
    http_address: str,
    forward: str | None,
    token: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    max_request_mib: float,
) -> None:
    """Receive OTLP traces (gRPC, HTTP protobuf/JSON) into a run store until interrupted.

    A request is acknowledged once its spans are in the write-ahead spool (fsync'ed), so a killed
    collector loses no acknowledged span: the next start stores what the spool holds.
    """
    from xsp.collector.server import CollectorConfig
    from xsp.collector.server import serve as run_server

    config = CollectorConfig(
        store=store_dir,
        grpc_address=grpc_address or None,
        http_address=http_address or None,
        forward=forward,
        token=token,
        tls_cert=tls_cert,
        tls_key=tls_key,
        max_request_bytes=int(max_request_mib * 1024 * 1024),
        store_workers=1,  # conversion in its own process: the receivers keep the GIL
    )

    def ready(c: Any) -> None:
        parts = []
        if c.grpc_port:
            parts.append(f"gRPC {grpc_address.rsplit(':', 1)[0]}:{c.grpc_port}")
        if c.http_port:
            parts.append(f"HTTP {http_address.rsplit(':', 1)[0]}:{c.http_port}")
        replaying = len(c.spool.recovered)
        console.print(
            f"xsp collector: receiving on {', '.join(parts)}; store {store_dir}"
            + (f"; storing {replaying} spooled segments in the background" if replaying else ""),
            highlight=False,
        )

    run_server(config, ready)
