"""The steady heap of every level-set process (xsp.tracer.run.heap): glibc keeps what a step
frees, so that the untraced baseline does not depend on where the tracer's own allocations sit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xsp.tracer.run import heap
from xsp.tracer.run.runner import LeveledSpec, run_leveled
from xsp.tracer.spec import ProfileSpec

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="mallopt is glibc's",
)

# A step's 8 MiB activation, allocated and freed: where glibc took it from, and what stays in
# the heap after the free (mallinfo2: arena = the heap's bytes, hblkhd = mmapped blocks).
STEP = textwrap.dedent(
    """
    import ctypes, json, sys
    sys.path.insert(0, {root!r})
    from xsp.tracer.run import heap

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.mallinfo2.restype = Info
    applied = heap.keep_freed_memory()
    block = libc.malloc(8 << 20)
    ctypes.memset(block, 1, 8 << 20)
    during = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    print(json.dumps({{"applied": applied, "mmapped_during": during.hblkhd,
                      "heap_after_free": after.arena}}))
    """
).format(root=str(ROOT))


def _step(**env: str) -> dict[str, int | str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", STEP], env={**environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_level_set_process_keeps_a_freed_block_in_its_heap() -> None:
    steady = _step()
    assert steady["applied"] == heap.KEPT
    assert steady["mmapped_during"] < 8 << 20  # from the heap, not a fresh mmap
    assert steady["heap_after_free"] >= 8 << 20  # kept for the next step: no trim
    # glibc's defaults, which the baseline had: the block is mapped and given back each time
    default = _step(XSP_STEADY_HEAP="0")
    assert default["applied"] == heap.DEFAULT
    assert default["mmapped_during"] >= 8 << 20
    assert default["heap_after_free"] < 8 << 20


def test_the_users_own_malloc_settings_win() -> None:
    assert heap.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "131072"}) == heap.USER
    assert heap.keep_freed_memory({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) == heap.USER
    users = _step(MALLOC_MMAP_THRESHOLD_="131072")
    assert users["applied"] == heap.USER
    assert users["mmapped_during"] >= 8 << 20  # their 128 KiB threshold, not xsp's 32 MiB


def test_the_run_says_which_heap_it_measured_with(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    # 2 traced iterations, each after an untraced one in the MF process: 5 steps
    script.write_text("import xsp\nfor _ in range(5):\n    xsp.step()\n")
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(iterations=2, warmup=0, device="cpu", command=("python", str(script))),
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    for levels in ("M", "MF"):
        meta = json.loads((tmp_path / "R" / levels / "run.json").read_text())
        assert meta["resource"]["xsp.host.heap"] == heap.KEPT
