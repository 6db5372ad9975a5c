"""``xsp analyze`` of one measurement on an S3 object store against the same on local disk: the
same output, and the time of each (a fresh process each run, alternated). The store is a real
SeaweedFS S3 gateway on loopback (``scripts/build-seaweedfs.sh``), started here.

    python benchmarks/object_store.py [--store DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.object_store import WEED_BIN, SeaweedS3  # noqa: E402
from xsp.core.store import location  # noqa: E402

DEFAULT_STORE = ROOT / "benchmarks" / "data" / "r50-b64-train"


def _analyze(target: str, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "analyze", target],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return time.perf_counter() - start, done.stdout


def _unpadded(text: str) -> list[str]:
    """Lines without the padding a table's title gets (a path and a URI differ in length)."""
    return [line.rstrip() for line in text.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not WEED_BIN.exists():
        sys.exit(f"needs SeaweedFS at {WEED_BIN}: run scripts/build-seaweedfs.sh")
    with tempfile.TemporaryDirectory() as work:
        server = SeaweedS3(Path(work))
        try:
            os.environ.update(server.env)  # this process's staged_read finds it as xsp does
            env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
            uri = server.uri(args.store.name)
            objects = location.object_store(uri, server.env).upload(args.store)
            size = sum(p.stat().st_size for p in args.store.rglob("*") if p.is_file())
            print(f"{args.store} ({size / 1e6:.1f} MB, {objects} objects) -> {uri}")
            local_s, remote_s, same = [], [], True
            for _ in range(args.repeats):
                seconds, local_out = _analyze(str(args.store), env)
                local_s.append(seconds)
                seconds, remote_out = _analyze(uri, env)
                remote_s.append(seconds)
                same &= _unpadded(remote_out) == _unpadded(local_out.replace(str(args.store), uri))
            for name, times in (("local disk", local_s), ("object store", remote_s)):
                runs = ", ".join(f"{t:.2f}" for t in times)
                print(f"{name:>12}: median {statistics.median(times):.2f} s ({runs})")
            print(f"same output: {'yes' if same else 'NO'}")
            staging = []
            for _ in range(args.repeats):  # the copy alone, in this process
                start = time.perf_counter()
                with location.staged_read(uri):
                    staging.append(time.perf_counter() - start)
            runs = ", ".join(f"{t * 1e3:.0f}" for t in staging)
            print(f"staging copy: median {statistics.median(staging) * 1e3:.0f} ms ({runs})")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
