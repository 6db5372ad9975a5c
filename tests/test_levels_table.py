"""The table of levels (xsp.core.levels) is consistent: every dotted path it names resolves, in
the stage that may import it, and the names derived from it agree."""

from __future__ import annotations

import pytest

from xsp.core import levels, schema
from xsp.core.levelset import LevelSet


def test_the_order_and_names_come_from_the_table() -> None:
    letters = "".join(info.letter for info in levels.LEVELS)
    assert letters == "MFLGH"
    assert levels.ROOT.letter == "M"
    assert schema.LEVEL_ORDER == levels.LEVEL_ORDER == "MFLG"
    assert schema.LEVEL_BY_LETTER == {
        "M": schema.LEVEL_MODEL,
        "F": schema.LEVEL_FRAMEWORK,
        "L": schema.LEVEL_LIBRARY,
        "G": schema.LEVEL_GPU,
    }
    assert schema.COUNTER_LEVEL_SET == "MH" == LevelSet("hm")
    assert LevelSet("MH").counters and not LevelSet("MFLG").counters


@pytest.mark.parametrize("info", levels.LEVELS, ids=lambda info: info.letter)
def test_every_path_resolves_in_its_stage(info: levels.LevelInfo) -> None:
    # conversion and arena readers stay torch-free and capture-free: convert and core only
    if info.conversion:
        assert info.conversion.startswith("xsp.tracer.convert.")
        assert callable(levels.resolve(info.conversion))
    if info.arena_reader:
        assert info.arena_reader.startswith("xsp.core.arena:")
        assert callable(levels.resolve(info.arena_reader))
    captures = [c for c in (info.cuda, info.cpu) if c is not None]
    assert captures, f"level {info.letter} runs nowhere"
    pytest.importorskip("torch")
    for capture in captures:
        assert capture.factory.startswith("xsp.tracer.capture.levels.")
        assert callable(levels.resolve(capture.factory))
        if capture.environment:
            environment = levels.resolve(capture.environment)()
            assert all(isinstance(v, str) for v in environment.values())


def test_a_level_that_runs_alone_makes_no_spans() -> None:
    for info in levels.LEVELS:
        if info.alone:
            assert info.conversion is None and info.letter not in levels.LEVEL_ORDER
            with pytest.raises(ValueError, match="runs alone"):
                LevelSet(levels.LEVEL_ORDER + info.letter)


def test_device_needs_are_the_missing_captures() -> None:
    from xsp.core.errors import ConfigError
    from xsp.tracer.capture.levels import check_levels

    check_levels(LevelSet("MFL"), "cpu")
    with pytest.raises(ConfigError, match=r"\(on CPU, use M, MF or MFL\)"):
        check_levels(LevelSet("MFLG"), "cpu")
    with pytest.raises(ConfigError, match="level H reads GPU hardware counters"):
        check_levels(LevelSet("MH"), "cpu")
    assert levels.level("L").capture_on("cpu") is not levels.level("L").capture_on("cuda:0")
