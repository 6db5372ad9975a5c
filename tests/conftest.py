from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
import pytest

# M in one process unless a test asks for more (``--m-processes``): each further M process of a
# script's measurement runs the script again, seconds a test on the 2-core CI machine
os.environ.setdefault("XSP_M_PROCESSES", "1")


def reachable_from_root(table: pa.Table) -> bool:
    """True when every span of every trace reaches that trace's single root by parent links."""
    rows = table.select(["trace_id", "span_id", "parent_span_id"]).to_pylist()
    by_trace: dict[bytes, dict[int, int]] = {}
    for r in rows:
        by_trace.setdefault(r["trace_id"], {})[r["span_id"]] = r["parent_span_id"]
    for parents in by_trace.values():
        roots = [s for s, p in parents.items() if p == 0]
        if len(roots) != 1:
            return False
        for span in parents:
            seen = 0
            while parents.get(span, 0) != 0:
                span = parents[span]
                seen += 1
                if span not in parents or seen > len(parents):
                    return False
    return True


def ancestors(rows: dict[int, dict], span: dict) -> list[dict]:
    """The spans above ``span``, nearest first; ``rows`` maps span ids to span rows."""
    chain = []
    while span["parent_span_id"]:
        span = rows[span["parent_span_id"]]
        chain.append(span)
    return chain


@pytest.fixture
def cuda_device() -> str:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    return "cuda"


@pytest.fixture(autouse=True, scope="session")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What the analyses keep for the next reader (the replay's fits) goes to a folder of the
    session's, never the real home's ``~/.cache/xsp`` (subprocesses inherit it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XSP_CACHE_DIR", str(tmp_path_factory.mktemp("xsp-cache")))
        yield
