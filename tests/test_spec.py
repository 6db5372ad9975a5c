"""The level set and the run spec: values parsed once, that every stage reads."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from xsp.core.levelset import LevelSet, parse_level_sets
from xsp.tracer.spec import ProfileSpec, RunSpec


def test_a_level_set_is_its_canonical_text_and_says_what_it_records() -> None:
    mflg = LevelSet("gLmf")
    assert mflg == "MFLG" and str(mflg) == "MFLG" and type(str(mflg)) is str
    assert json.dumps({"levels": mflg}) == '{"levels": "MFLG"}'  # run.json, the manifest
    assert Path("R") / mflg == Path("R/MFLG")  # the run's directory
    assert pickle.loads(pickle.dumps(mflg)) == mflg  # the fork server pickles it
    assert (mflg.framework, mflg.library, mflg.gpu, mflg.counters) == (True, True, True, False)
    assert mflg.timed_levels == ("model", "framework", "library", "gpu")
    mlg = LevelSet("MLG")
    assert (mlg.framework, mlg.library, mlg.gpu) == (False, True, True)
    mh = LevelSet("hm")
    assert mh == "MH" and mh.counters and mh.timed_levels == ("model",)
    assert LevelSet(mh) is mh


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("MX", "use letters from 'MFLG'"),
        ("MFF", "a level letter repeats"),
        ("FL", "every level set includes M"),
        ("MFH", "the hardware-counter level H runs alone with M"),
        ("", "use letters from"),
    ],
)
def test_a_bad_level_set_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"bad level set {text!r}: {message}"):
        LevelSet(text)


def test_level_sets_parse_from_one_string_and_refuse_repeats() -> None:
    assert parse_level_sets("m, mf,MFLG") == ["M", "MF", "MFLG"]
    with pytest.raises(ValueError, match="a level set repeats"):
        parse_level_sets("M,MF,fm")
    with pytest.raises(ValueError, match="give at least one"):
        parse_level_sets(" , ")


def test_a_run_spec_survives_its_trip_through_json() -> None:
    run = RunSpec(
        LevelSet("MF"),
        ProfileSpec(iterations=3, model="torchvision:resnet18", command=["a", "b"]),  # type: ignore[arg-type]
        out="/r/MF",
        measurement_id="m",
    )
    back = RunSpec.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back == run and isinstance(back.levels, LevelSet)
    assert back.profile.command == ("a", "b") and back.profile.workload == "torchvision:resnet18"
    assert run.with_profile(device="cuda:1").profile.device == "cuda:1"


def test_a_session_built_from_keywords_reads_the_same_spec(tmp_path: Path) -> None:
    from xsp.tracer.capture.session import Session

    session = Session("fm", iterations=3, warmup=1, out=tmp_path / "MF", device="cpu")
    assert session.levels == "MF" and isinstance(session.levels, LevelSet)
    assert session.spec == RunSpec(
        LevelSet("MF"),
        ProfileSpec(iterations=3, warmup=1, device="cpu"),
        out=str(tmp_path / "MF"),
        workload="script",
    )
    again = Session.from_spec(session.spec)
    assert (again.levels, again.iterations, again.warmup, again.run_dir) == (
        "MF",
        3,
        1,
        tmp_path / "MF",
    )
