"""run.json and manifest.json, typed (``xsp.core.store.documents``): every committed one reads
and gives back the same JSON object, and the status rule lives in one place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xsp.core import store
from xsp.core.store import Manifest, ManifestRun, RunMeta, Status

ROOT = Path(__file__).resolve().parents[1]
_DATA = [ROOT / "benchmarks" / "data", ROOT / "tests" / "data"]
RUN_METAS = sorted(p for d in _DATA for p in d.rglob(store.RUN_META))
MANIFESTS = sorted(p for d in _DATA for p in d.rglob(store.MANIFEST))


def test_every_committed_run_json_round_trips() -> None:
    assert RUN_METAS
    for path in RUN_METAS:
        data = json.loads(path.read_text())
        assert RunMeta.from_json(data).to_json() == data, path


def test_every_committed_manifest_round_trips() -> None:
    assert MANIFESTS
    for path in MANIFESTS:
        data = json.loads(path.read_text())
        manifest = Manifest.from_json(data)
        assert manifest.to_json() == data, path
        assert all(isinstance(r, ManifestRun) for r in manifest.runs or ())


def test_the_typed_keys_read_typed() -> None:
    meta = RunMeta.from_json(json.loads(RUN_METAS[0].read_text()))
    assert isinstance(meta.status, Status) and isinstance(meta.levels, str)
    assert isinstance(meta.files, tuple) and "status" not in meta.extra


def test_a_reason_makes_ok_partial_and_nothing_else() -> None:
    meta = RunMeta(status=Status.OK, status_reasons=("a",))
    partial = meta.with_reasons(["b", "a"])
    assert partial.status is Status.PARTIAL and partial.status_reasons == ("a", "b")
    assert meta.with_reasons([]) is meta  # no reason: as it was
    assert RunMeta(status=Status.ERROR).with_reasons(["x"]).status is Status.ERROR
    entry = ManifestRun(status=Status.OK).with_reasons(["x"])
    assert entry.status is Status.PARTIAL and entry.status_reasons == ("x",)
    assert Status.OK.with_reason() is Status.PARTIAL
    assert Status.INTERRUPTED.with_reason() is Status.INTERRUPTED


def test_an_old_run_json_reads_and_keeps_what_it_had(tmp_path: Path) -> None:
    """An older writer's file: no run id, no status_reasons, an unknown status word, a key of
    its own, a count of another type. It reads, and it is written back as it was."""
    old = {
        "format": "xsp/1",
        "levels": "M",
        "status": "finished",
        "spans": "12",
        "error": None,
        "resource": {"service.name": "x"},
        "legacy_key": [1, 2],
    }
    path = tmp_path / store.RUN_META
    path.write_text(json.dumps(old))
    meta = store.read_run_meta(path)
    assert meta.levels == "M" and meta.status is None and meta.spans is None
    assert meta.run_id is None and meta.status_reasons is None and meta.error is None
    assert meta.extra == {"status": "finished", "spans": "12", "legacy_key": [1, 2]}
    store.write_run_meta(path, meta)
    assert json.loads(path.read_text()) == old


def test_amend_writes_back_whole(tmp_path: Path) -> None:
    path = tmp_path / store.RUN_META
    store.write_run_meta(path, RunMeta(levels="M", status=Status.OK, error=None))
    assert "error" not in json.loads(path.read_text())  # None and never read as null: absent
    store.amend_run_meta(path, lambda m: m.with_reasons(["fewer iterations"]))
    written = json.loads(path.read_text())
    assert written == {"levels": "M", "status": "partial", "status_reasons": ["fewer iterations"]}
    manifest_path = tmp_path / store.MANIFEST
    store.write_manifest(manifest_path, Manifest(status=Status.RUNNING, runs=()))
    store.amend_manifest(manifest_path, lambda m: Manifest.from_json({**m.to_json(), "x": 1}))
    assert store.read_manifest(manifest_path).to_json() == {"status": "running", "runs": [], "x": 1}


@pytest.mark.parametrize("status", list(Status))
def test_a_status_is_its_json_word(status: Status) -> None:
    assert json.dumps(status) == f'"{status.value}"'


def test_partial_only_for_the_programs_profiler_goes_on() -> None:
    """A level set whose one missing part is what the program's own torch.profiler held does
    not stop the level sets after it; any other reason beside it does."""
    line = "the program's torch.profiler held CUPTI in 2 measured iterations (3, 4): ..."
    held = {"spans_missing": True, "line": line}
    base = {"status": "partial", "status_reasons": [line], "program_profiler": held}
    assert RunMeta.from_json(base).partial_for_the_programs_profiler
    other = {**base, "status_reasons": [line, "CUPTI dropped 3 records (buffers full)"]}
    assert not RunMeta.from_json(other).partial_for_the_programs_profiler
    memory_only = {**base, "program_profiler": {**held, "spans_missing": False}}
    assert not RunMeta.from_json(memory_only).partial_for_the_programs_profiler
    assert not RunMeta.from_json({**base, "status": "error"}).partial_for_the_programs_profiler
