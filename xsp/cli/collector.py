"""``xsp collector serve``: the OTLP collector service."""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
from pathlib import Path
from typing import Any

import click

from xsp.cli.common import console, fail, warn

__all__ = ["MAX_REQUEST_MIB_LIMIT", "collector", "serve"]

#: gRPC's and HTTP's request limit may not be set above this (a GiB).
MAX_REQUEST_MIB_LIMIT = 1024


def _request_mib(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A finite size above 0: nan or inf would pass a range check, and 0 or less would leave
    HTTP refusing every request while gRPC took any."""
    if not (math.isfinite(value) and 0 < value <= MAX_REQUEST_MIB_LIMIT):
        raise click.BadParameter(
            f"{value:g}: give a size above 0 and at most {MAX_REQUEST_MIB_LIMIT}"
        )
    return value


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _token(token: str | None, token_file: Path | None) -> str | None:
    """The bearer token: from --token-file (kept out of ps), else --token or
    XSP_COLLECTOR_TOKEN."""
    if token_file is None:
        return token
    if token is not None:
        fail("give the token once: --token (or XSP_COLLECTOR_TOKEN) or --token-file")
    try:
        text = token_file.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read the token file {token_file}: {exc}")
    if not text:
        fail(f"the token file {token_file} is empty")
    return text


def _warn_if_open(addresses: list[str], token: str | None, tls: bool) -> None:
    """One line when a receiver listens beyond this machine without a token, or sends its token
    in the clear."""
    exposed = [a for a in addresses if a and not _is_loopback(a)]
    if not exposed:
        return
    where = ", ".join(exposed)
    if token is None:
        warn(
            f"listening on {where} without a token: anyone who reaches it can write spans into "
            "the store (give --token-file or XSP_COLLECTOR_TOKEN)"
        )
    elif not tls:
        warn(f"listening on {where} without TLS: the token crosses the network in the clear")


def _local_directory(
    store: str, spool: Path | None, replica: str | None
) -> tuple[Path, str | None]:
    """The local store, or for an ``s3://`` store the replica's local directory (its spool and
    working copy: ``--spool``, else one of its own under $XDG_STATE_HOME) and the URI."""
    if not store.startswith("s3://"):
        if spool is not None:
            fail("--spool is for an s3:// store (a local store keeps its spool in STORE/.spool)")
        return Path(store), None
    if spool is not None:
        return spool, store
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    where = store.removeprefix("s3://").strip("/")
    digest = hashlib.blake2b(where.encode(), digest_size=6).hexdigest()
    name = f"{where.replace('/', '_')[:80]}~{digest}"  # one directory per store and replica
    return state / "xsp/collector" / name / (replica or "collector"), store


@click.group()
def collector() -> None:
    """The OTLP collector service."""


@collector.command()
@click.option(
    "--store",
    "store",
    required=True,
    help="Run store to write (created if missing): a directory, or s3://bucket/prefix.",
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
    "--token",
    envvar="XSP_COLLECTOR_TOKEN",
    help="Require 'Authorization: Bearer TOKEN' (XSP_COLLECTOR_TOKEN; shows in ps).",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    help="Read the token from this file's first line instead (kept out of ps).",
)
@click.option("--tls-cert", type=click.Path(exists=True, path_type=Path))
@click.option("--tls-key", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--max-request-mib",
    type=float,
    default=32,
    show_default=True,
    callback=_request_mib,
    help=f"Largest request, gRPC and HTTP alike (above 0, at most {MAX_REQUEST_MIB_LIMIT}).",
)
@click.option(
    "--replica",
    envvar="XSP_COLLECTOR_REPLICA",
    help="This collector's name among replicas sharing the store (XSP_COLLECTOR_REPLICA): "
    "its own spool and part names. Keep it across restarts.",
)
@click.option(
    "--spool",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="XSP_COLLECTOR_SPOOL",
    help="For an s3:// store: the local directory of this replica's spool and working copy "
    "(XSP_COLLECTOR_SPOOL; default under $XDG_STATE_HOME/xsp/collector). Keep it across "
    "restarts: acknowledged spans wait there until they are on S3.",
)
def serve(
    store: str,
    grpc_address: str,
    http_address: str,
    forward: str | None,
    token: str | None,
    token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    max_request_mib: float,
    replica: str | None,
    spool: Path | None,
) -> None:
    """Receive OTLP traces (gRPC, HTTP protobuf/JSON) into a run store until interrupted.

    A request is acknowledged once its spans are in the write-ahead spool (fsync'ed), so a killed
    collector loses no acknowledged span: the next start stores what the spool holds. With an
    s3:// store the spool stays on local disk and each part goes up as soon as it is written.
    """
    from xsp.collector.server import CollectorConfig
    from xsp.collector.server import serve as run_server

    store_dir, object_store = _local_directory(store, spool, replica)
    token = _token(token, token_file)
    _warn_if_open([grpc_address, http_address], token, tls_cert is not None)

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
        replica=replica or None,
        object_store=object_store,
    )

    def ready(c: Any) -> None:
        parts = []
        if c.grpc_port:
            parts.append(f"gRPC {grpc_address.rsplit(':', 1)[0]}:{c.grpc_port}")
        if c.http_port:
            parts.append(f"HTTP {http_address.rsplit(':', 1)[0]}:{c.http_port}")
        replaying = len(c.spool.recovered)
        console.print(
            f"xsp collector: receiving on {', '.join(parts)}; store {store}"
            + (f" (spool and working copy in {store_dir})" if object_store else "")
            + (f" (replica {replica})" if replica else "")
            + (f"; storing {replaying} spooled segments in the background" if replaying else ""),
            highlight=False,
        )

    run_server(config, ready)
