"""The leveled runner's overlapped start: a level set's process starts while the one before
finishes, but measures only once that one has exited."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from xsp.core.errors import XspError
from xsp.core.levelset import LevelSet
from xsp.core.store import Manifest, open_measurement
from xsp.tracer.run.runner import LeveledSpec, run_leveled
from xsp.tracer.spec import ProfileSpec

ROOT = Path(__file__).resolve().parents[1]


def _squeezenet(
    tmp_path: Path, level_sets: tuple[str, ...], iterations: int = 2, warmup: int = 1, **kw: Any
) -> LeveledSpec:
    """A zoo model's measurement on the CPU (SqueezeNet 1.1, forked level sets) into
    ``tmp_path/R``; ``kw`` are further ``LeveledSpec`` fields."""
    return LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=iterations,
            warmup=warmup,
            device="cpu",
            model="torchvision:squeezenet1_1",
        ),
        level_sets=level_sets,
        fork_server=True,
        **kw,
    )


def test_an_overlapped_level_set_switches_its_levels_on_after_the_one_before_exited(
    tmp_path: Path,
) -> None:
    spec = _squeezenet(tmp_path, ("M", "MF"), iterations=3, warmup=2, overlap=True)
    result = run_leveled(spec)
    assert result.ok, result.failure
    runs = {run.levels: run.meta for run in open_measurement(spec.out)}
    assert runs["M"]["finished_ns"] < runs["MF"]["phases_ns"]["levels_on"]
    assert runs["MF"]["phases_ns"]["ready"] <= runs["MF"]["phases_ns"]["levels_on"]
    seconds = {entry.levels: entry.seconds for entry in result.runs}
    assert "waiting_for_previous" in seconds["MF"] and "waiting_for_previous" not in seconds["M"]
    assert runs["MF"]["spans_by_level"]["framework"] > 0


FAILS_AFTER_MEASURING = """
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
    raise RuntimeError("failed after measuring")
"""


def test_a_level_set_that_fails_cancels_the_one_started_ahead_of_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path, FAILS_AFTER_MEASURING, ("M", "MF"), log_stderr=True, overlap=True)
    events: list[tuple[str, str]] = []
    result = run_leveled(spec, progress=lambda levels, phase, *_: events.append((levels, phase)))
    assert ("MF", "start") in events  # started once M had measured, then dropped
    assert not result.ok
    assert [entry.levels for entry in result.runs] == ["M"]
    assert "failed after measuring" in (spec.out / "M.stderr.log").read_text()
    assert not (spec.out / "MF").exists() and not (spec.out / "MF.stderr.log").exists()
    manifest = json.loads((spec.out / "manifest.json").read_text())
    assert manifest["status"] == "error" and len(manifest["runs"]) == 1


HOLDS_THE_DEVICE = """
    import sys
    import time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    busy, refused = Path({busy!r}), Path({refused!r})
    if busy.exists():  # the level set before still holds the "device": fail before measuring
        refused.write_text("")
        raise RuntimeError("out of memory: the device is held")
    busy.write_text("")
    for _ in range(4):
        with xsp.iteration():
            torch.ones(4).sum()
    deadline = time.monotonic() + 60
    while not refused.exists() and time.monotonic() < deadline:  # until the next one tried
        time.sleep(0.05)
    busy.unlink()
"""


def test_a_level_set_that_fails_while_started_ahead_runs_again_on_its_own(tmp_path: Path) -> None:
    busy, refused = tmp_path / "busy", tmp_path / "refused"
    spec = _spec(
        tmp_path,
        HOLDS_THE_DEVICE,
        ("M", "MF"),
        # levels come on after the first of two warm-up iterations: a process started ahead
        # runs the script up to there
        warmup=2,
        fields={"busy": str(busy), "refused": str(refused)},
        log_stderr=True,
        overlap=True,
    )
    events: list[tuple[str, str]] = []
    result = run_leveled(spec, progress=lambda levels, phase, *_: events.append((levels, phase)))
    assert result.ok, result.failure
    assert refused.exists()  # MF did start ahead and fail
    assert events.count(("MF", "start")) == 2
    entries = {entry.levels: entry for entry in result.runs}
    assert entries["MF"].status == "ok"
    assert "out of memory: the device is held" in (entries["MF"].failed_ahead or "")
    assert entries["M"].failed_ahead is None
    assert {run.levels: run.meta["iterations_measured"] for run in open_measurement(spec.out)} == {
        "M": 2,
        "MF": 2,
    }


def _spec(
    tmp_path: Path,
    body: str,
    level_sets: tuple[str, ...] = ("M",),
    warmup: int = 0,
    fields: dict[str, str] | None = None,
    **kw: object,
) -> LeveledSpec:
    """A 2-iteration CPU measurement of the script ``body`` (formatted with ``root`` and
    ``fields``). The scripts run exactly their warm-up and iterations, so the MF process runs
    no untraced iterations between its traced ones unless ``interleave`` is given
    (tests/test_interleave.py covers those)."""
    kw.setdefault("interleave", False)
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body.format(root=str(ROOT), **(fields or {}))))
    return LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=2, warmup=warmup, device="cpu", command=(sys.executable, str(script))
        ),
        level_sets=level_sets,
        **kw,
    )


CONVERSION_FAILS = """
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp.tracer.export.finish
    import xsp

    def broken(*args, **kwargs):
        raise RuntimeError("forced conversion failure")

    xsp.tracer.export.finish.build_table = broken  # the fault: conversion fails in this process
    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
"""


def test_a_failed_conversion_is_not_counted_as_a_success(tmp_path: Path) -> None:
    spec = _spec(tmp_path, CONVERSION_FAILS)
    result = run_leveled(spec)
    assert not result.ok and result.status == "error" and result.exit_code == 1
    entry = result.runs[0]
    assert entry.status == "error" and entry.spans == 0
    assert "conversion failed: RuntimeError: forced conversion failure" in entry.error
    assert entry.status_reasons is not None and entry.status_reasons[0] == entry.error
    manifest = json.loads((spec.out / "manifest.json").read_text())
    assert manifest["status"] == "error" and manifest["runs"][0]["status"] == "error"
    assert "forced conversion failure" in (result.failure or "")


ENDS = """
    import os
    import signal
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
    how = {how!r}
    if how == "os._exit":
        os._exit(5)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
"""


@pytest.mark.parametrize(
    ("how", "program", "code"),
    [
        ("os._exit", {"exit_code": 5}, 5),
        ("sigkill", {"signal": 9, "signal_name": "SIGKILL"}, 128 + 9),
        ("sys.exit", {"exit_code": 3}, 3),
    ],
)
def test_the_program_end_is_recorded_and_passed_on(
    tmp_path: Path, how: str, program: dict[str, object], code: int
) -> None:
    spec = _spec(tmp_path, ENDS.replace("{how!r}", repr(how)))
    result = run_leveled(spec)
    entry = result.runs[0]
    # a program that died before xsp's finish: its finished iterations come from the arena
    status = "error" if how == "sys.exit" else "partial"
    assert entry.program == program and entry.status == status
    assert result.exit_code == code
    meta = json.loads((spec.out / "M" / "run.json").read_text())
    assert meta["status"] == status and meta["program"] == program  # never left "running"
    manifest = json.loads((spec.out / "manifest.json").read_text())
    assert manifest["runs"][0]["program"] == program and manifest["status"] == status
    if how != "sys.exit":
        ended = "exited with 5" if how == "os._exit" else "was killed by SIGKILL"
        assert entry.error == f"the program {ended}"
        assert meta["recovered"] is True and meta["iterations_measured"] == 2
        assert f"the program {ended} after 2 measured iterations" in meta["status_reasons"]


def test_a_time_limit_kills_a_forked_level_set_and_says_so(tmp_path: Path) -> None:
    import time

    spec = _squeezenet(tmp_path, ("M",), iterations=100_000, warmup=0, timeout_s=1)
    started = time.monotonic()
    result = run_leveled(spec)
    entry = result.runs[0]
    assert entry.status == "error" and entry.timed_out is True
    assert entry.program == {"signal": 9, "signal_name": "SIGKILL"}
    assert "timed out after 1 s" in entry.error
    assert time.monotonic() - started < 60
    run_json = spec.out / "M" / "run.json"  # killed while starting up, it has none yet
    if run_json.exists():
        meta = json.loads(run_json.read_text())
        assert meta["status"] == "error" and meta["timed_out"] is True


def test_the_runner_hands_its_child_one_spec_object(tmp_path: Path) -> None:
    """The runner and the level-set process share one serialized object, not two argument
    parsers kept in step: what the runner builds is what the child reads back."""
    from xsp.tracer.run.placement import child_spec
    from xsp.tracer.run.plan import LeveledSpec
    from xsp.tracer.run.protocol import ChildSpec

    spec = LeveledSpec(
        out=tmp_path,
        profile=ProfileSpec(
            iterations=3,
            warmup=1,
            device="cpu",
            model="torchvision:resnet18",
            batch_size=2,
            mode="train",
            op_shapes=False,
        ),
        level_sets=["M", "MF"],
    )
    sent = child_spec(spec, LevelSet("MF"), "m-1")
    back = ChildSpec.from_argv(sent.to_argv())
    assert back == sent and back.run.out == str(tmp_path / "MF") and not back.run.profile.op_shapes
    assert isinstance(back.run.levels, LevelSet) and back.run.profile.mode == "train"
    script = child_spec(
        LeveledSpec(
            out=tmp_path,
            profile=ProfileSpec(
                iterations=1, warmup=0, command=("python", "train.py", "--lr", "0.1")
            ),
            level_sets=["M"],
        ),
        LevelSet("M"),
        "m-2",
    )
    assert ChildSpec.from_argv(script.to_argv()).run.profile.command == ("train.py", "--lr", "0.1")
    with pytest.raises(XspError, match="takes --spec JSON"):
        ChildSpec.from_argv(["--levels", "M"])


def _child_profiles(tmp_path: Path, level_sets: list[str]) -> list[ProfileSpec]:
    """What each level-set process of a ResNet-18 measurement at ``level_sets`` is told."""
    from xsp.tracer.run.placement import child_spec

    spec = LeveledSpec(
        out=tmp_path, profile=ProfileSpec(model="torchvision:resnet18"), level_sets=level_sets
    )
    return [child_spec(spec, LevelSet(s), "m").run.profile for s in level_sets]


def test_only_the_deepest_framework_level_set_records_op_shapes(tmp_path: Path) -> None:
    from xsp.tracer.run.placement import child_spec

    levels = ["M", "MF", "MFL", "MFLG"]
    shapes = [profile.op_shapes for profile in _child_profiles(tmp_path, levels)]
    assert shapes == [False, False, False, True]
    assert _child_profiles(tmp_path, ["M", "MF"])[1].op_shapes
    ranks = LeveledSpec(
        out=tmp_path,
        profile=ProfileSpec(command=("torchrun", "--nproc-per-node", "2", "t.py")),
        level_sets=levels,
    )
    assert child_spec(
        ranks, LevelSet("MF"), "m"
    ).run.profile.op_shapes  # collective sizes come from them


def test_only_the_shallowest_framework_level_set_calibrates(tmp_path: Path) -> None:
    """The replay reads host times from the shallowest run with F, so only its process times
    F's cost (0.5-1.3 s of a switch-on on the H200); the deeper ones skip the probes, and the
    replay still finds its calibration."""
    from xsp.analysis.measurement.matching import level_sources
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay.host_timeline import calibration

    levels = ["M", "MF", "MFL", "MFLG"]
    calibrated = [profile.calibrate for profile in _child_profiles(tmp_path, levels)]
    assert calibrated == [False, True, False, False]
    assert _child_profiles(tmp_path, ["MFLG"])[0].calibrate
    run = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(iterations=2, device="cpu", model="torchvision:squeezenet1_1"),
        level_sets=("MF", "MFL"),
    )
    result = run_leveled(run)
    assert result.ok
    # the manifest's phases give the calibration its own: in MF's process only
    phases = {entry.levels: entry.seconds for entry in result.runs}
    assert phases["MF"]["calibration"] > 0 and "calibration" not in phases["MFL"]
    metas = {r.levels: r.meta for r in open_measurement(run.out)}
    assert "calibration" in metas["MF"] and "calibration" not in metas["MFL"]
    assert "calibration, levels on" in metas["MF"]["switch_on_ms"]
    assert set(metas["MFL"]["switch_on_ms"]) == {"level M", "level F", "level L"}
    store = MeasurementStore(run.out)
    source = level_sources(store)[1]["framework"]
    found = calibration(store, source)
    assert found.source == "measured in the MF run's process" and found.op_ns is not None


def test_a_process_phases_split_the_calibration_off_its_switch_on() -> None:
    """Switching the levels on took 1.0 s, of which run.json's parts give F's calibration
    0.3 + 0.6 s: the phases say calibration 0.9 s and switch-on 0.1 s, and still add up."""
    from xsp.core.store import RunMeta
    from xsp.tracer.run.manifest import phase_seconds

    s = 1_000_000_000
    meta = {
        "started_ns": 2 * s,
        "phases_ns": {"levels_on": 3 * s, "enabled": 4 * s, "measured": 5 * s},
        "finished_ns": 6 * s,
        "switch_on_ms": {"calibration, levels off": 300.0, "level F": 2.0,
                         "calibration, levels on": 600.0},
    }  # fmt: skip
    seconds = phase_seconds(RunMeta.from_json(meta), spawned_ns=1 * s, ended_ns=7 * s)
    assert seconds["calibration"] == 0.9 and seconds["switch_on"] == 0.1
    assert sum(v for k, v in seconds.items() if k != "total") == pytest.approx(seconds["total"])
    assert seconds["total"] == 6.0
    del meta["switch_on_ms"]  # a run.json older than the parts: the switch-on whole
    assert "calibration" not in phase_seconds(RunMeta.from_json(meta), 1 * s, 7 * s)


WRITES_ITS_ENVIRONMENT = """
    import json
    import os
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    names = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    with open(os.environ["ENV_OUT"], "w") as out:
        json.dump({{name: os.environ.get(name) for name in names}}, out)
    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
"""


def test_every_process_the_runner_starts_has_nvlink_multicast_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 reach
    the program even when the caller's environment and the spec's own say otherwise."""
    from xsp.tracer.run.environment import SHARED_HOST_ENV, child_environment

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    env_out = tmp_path / "env.json"
    spec = _spec(
        tmp_path,
        WRITES_ITS_ENVIRONMENT,
        env={"NVSHMEM_DISABLE_NVLS": "0", "ENV_OUT": str(env_out)},
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    assert json.loads(env_out.read_text()) == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    # a forked zoo process gets the same environment (the fork server's child replaces its own)
    zoo = LeveledSpec(
        out=tmp_path / "Z", profile=ProfileSpec(model="torchvision:resnet18"), env=dict(spec.env)
    )
    forced = child_environment(zoo, LevelSet("M"))
    assert {k: forced[k] for k in SHARED_HOST_ENV} == SHARED_HOST_ENV


APPENDS_ITS_COMPILE_THREADS = """
    import os
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    import torch
    import xsp

    with open(os.environ["ENV_OUT"], "a") as out:
        out.write(f"{{os.environ.get('TORCHINDUCTOR_COMPILE_THREADS')}}\\n")
    if os.environ.get("SAVES_A_GRAPH"):  # as inductor saves a compiled graph in its cache
        graph = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"], "fxgraph", "ab", "graph")
        graph.parent.mkdir(parents=True, exist_ok=True)
        graph.write_bytes(b"compiled")
    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
"""


@pytest.mark.parametrize(
    ("users", "saves", "expected"),
    [
        (None, True, ["None", "1"]),
        ("4", True, ["4", "4"]),
        (None, False, ["None", "None"]),
    ],
)
def test_level_sets_after_a_compiling_first_one_start_no_inductor_compile_workers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    users: str | None,
    saves: bool,
    expected: list[str],
) -> None:
    """The first level set compiles a torch.compile'd program into the measurement's inductor
    cache; the later ones load it, and with inductor's compile workers they would wait 6-13 s at
    exit for workers that only loaded kernels. The user's own TORCHINDUCTOR_COMPILE_THREADS
    wins, and where the first saved nothing the next keeps its workers to compile with."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    if users is None:
        monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", users)
    env_out = tmp_path / "compile_threads.txt"
    env = {"ENV_OUT": str(env_out), **({"SAVES_A_GRAPH": "1"} if saves else {})}
    spec = _spec(
        tmp_path,
        APPENDS_ITS_COMPILE_THREADS,
        level_sets=("M", "MF"),
        env=env,
        overlap=False,  # one after another: the lines in level-set order
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    assert env_out.read_text().splitlines() == expected


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["python", "nosuch.py"], "script not found: nosuch.py"),
        (["python", "-m", "nosuch_module_xyz"], "no module named 'nosuch_module_xyz'"),
        (["python", "-O", "train.py"], "cannot trace python -O: xsp runs the script in its own"),
        (["python", "-u", "-c"], "python -c needs the code to run"),
        (["torchrun", "--nproc-per-node", "2", "nosuch.py"], "script not found: nosuch.py"),
        (["python", "-m", "torch.distributed.run", "-m", "nosuch_xyz"], "no module named"),
    ],
)
def test_a_python_command_that_cannot_run_is_refused_before_anything_starts(
    tmp_path: Path, command: list[str], message: str
) -> None:
    from xsp.core.errors import ConfigError
    from xsp.tracer.run.plan import validate

    spec = LeveledSpec(out=tmp_path / "R", profile=ProfileSpec(device="cpu", command=command))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(spec)
    assert not spec.out.exists()


CODE_AND_MODULE = """
import sys
import torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
print("ran as", __name__, sys.argv[1:])
"""


@pytest.mark.parametrize("how", ["-c", "-m"])
def test_python_c_and_m_from_the_working_directory_run_under_u(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    (tmp_path / "local_train.py").write_text(CODE_AND_MODULE)
    monkeypatch.chdir(tmp_path)  # python -m finds a module there, as the interpreter does
    program = CODE_AND_MODULE if how == "-c" else "local_train"
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=2, warmup=1, device="cpu", command=["python", "-u", how, program, "x"]
        ),
        level_sets=("M",),
        log_stderr=True,
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    (run,) = open_measurement(spec.out)
    assert run.meta["iterations_measured"] == 2


def test_a_script_the_user_interrupts_exits_130(tmp_path: Path) -> None:
    script = tmp_path / "interrupts.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters())\n"
        "for i in range(5):\n    model(torch.ones(1, 2)).sum().backward()\n    opt.step()\n"
        "    if i == 2:\n        raise KeyboardInterrupt\n"
    )
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(iterations=5, warmup=0, device="cpu", command=["python", str(script)]),
        level_sets=("M", "MF"),
    )
    result = run_leveled(spec)
    assert result.exit_code == 130
    with pytest.raises(XspError, match="its level sets were interrupted \\(M\\); each keeps"):
        open_measurement(spec.out)
    (run,) = open_measurement(spec.out / "M")  # what it stored, read alone
    # three optimizer steps ended three iterations; the fourth, which the interrupt cut, is kept
    # and marked with it, but not counted as measured (as the summary counts)
    assert run.meta["status"] == "interrupted" and run.meta["iterations_measured"] == 3
    steps = [s for s in run.spans().to_pylist() if s["kind"] == "step"]
    assert [s["status_message"] is None for s in steps] == [True, True, True, False]


def test_a_level_set_processs_messages_carry_one_xsp_prefix() -> None:
    import logging

    from xsp.tracer.run.child import _Prefixed

    def shown(message: str) -> str:
        record = logging.LogRecord("xsp", logging.WARNING, __file__, 1, message, None, None)
        return _Prefixed("%(message)s").format(record)

    assert shown("xsp: converting the recorded spans failed") == (
        "xsp: converting the recorded spans failed"
    )
    assert shown("warning: level set MF was interrupted") == (
        "xsp: warning: level set MF was interrupted"
    )


def test_a_fork_server_imports_its_models_zoo_and_a_campaigns_imports_every_zoo() -> None:
    from xsp.tracer.run import forkserver

    xsp_side = ("xsp.tracer.run.child", "xsp.tracer.workloads.zoo")
    assert forkserver.preload_for("torchvision:resnet50") == ("torch", "torchvision", *xsp_side)
    assert forkserver.preload_for("timm:vit_base_patch16_224") == ("torch", "timm", *xsp_side)
    assert forkserver.preload_for("transformers:bert") == ("torch", "transformers", *xsp_side)
    assert forkserver.preload_for("") == ("torch", *xsp_side)
    assert {"torchvision", "timm", "transformers", "xsp.tracer.workloads.preload"} <= set(
        forkserver.EVERY_ZOO
    )


def test_a_zoo_models_mf_runs_in_ms_process_once_m_has_stored_its_run(tmp_path: Path) -> None:
    """M and MF share a process (one CUDA start-up and first iteration, not two); MFL, whose
    level L needs its environment before the process starts, gets one of its own."""
    from xsp.analysis.tables.summary import time_line

    spec = _squeezenet(tmp_path, ("M", "MF", "MFL"), overlap=True, share_process=True)
    events: list[tuple[str, str]] = []
    result = run_leveled(spec, progress=lambda levels, phase, *_: events.append((levels, phase)))
    assert result.ok, result.failure
    runs = {run.levels: run.meta for run in open_measurement(spec.out)}
    pids = {levels: meta["resource"]["process.pid"] for levels, meta in runs.items()}
    assert pids["M"] == pids["MF"] != pids["MFL"]
    assert [entry.in_process_of for entry in result.runs] == [None, "M", None]
    assert runs["MF"]["started_ns"] >= runs["M"]["finished_ns"]
    assert runs["MFL"]["phases_ns"]["levels_on"] > runs["MF"]["finished_ns"]
    assert runs["MF"]["spans_by_level"]["framework"] > 0
    assert runs["MF"]["calibration"]["framework_ns_per_record"] > 0  # the shallowest with F
    order = [events.index(e) for e in [("M", "end"), ("MF", "start"), ("MF", "end")]]
    assert order == sorted(order)
    manifest = json.loads((spec.out / "manifest.json").read_text())
    line = time_line(Manifest.from_json(manifest))
    assert line is not None and "3 level sets in 2 processes" in line


def test_a_level_set_killed_in_a_shared_process_ends_the_measurement_there(
    tmp_path: Path,
) -> None:
    spec = _squeezenet(
        tmp_path, ("M", "MF"), iterations=100_000, warmup=0, share_process=True, timeout_s=1
    )
    result = run_leveled(spec)
    assert [entry.levels for entry in result.runs] == ["M"]
    assert result.runs[0].timed_out is True
    assert result.runs[0].program == {"signal": 9, "signal_name": "SIGKILL"}
    assert not (spec.out / "MF").exists()


def test_which_level_sets_share_a_process(tmp_path: Path) -> None:
    from xsp.tracer.run.placement import process_hosts

    def hosts(level_sets: tuple[str, ...], share: bool = True, **profile: object) -> list[str]:
        spec = LeveledSpec(
            out=tmp_path,
            profile=ProfileSpec(**{"model": "torchvision:resnet18", **profile}),  # type: ignore[arg-type]
            level_sets=level_sets,
            share_process=share,
        )
        return [",".join(group) for group in process_hosts(spec, spec.level_sets)]

    assert hosts(("M", "MF", "MFLG")) == ["M,MF", "", "MFLG"]
    assert hosts(("M", "MF", "MFLG"), share=False) == ["M", "MF", "MFLG"]
    assert hosts(("MF", "M")) == ["MF", "M"]  # the deeper one first: it would leave its hooks
    assert hosts(("M", "MFL", "MFLG")) == ["M", "MFL", "MFLG"]  # L needs its environment first
    assert hosts(("M", "MH")) == ["M", "MH"]
    assert hosts(("M", "MF"), model=None, command=("train.py",)) == ["M", "MF"]  # runs once
    assert hosts(("M", "MF"), fixes=("channels_last",)) == ["M", "MF"]


def test_the_child_spec_carries_the_level_sets_run_after_it_in_its_process(
    tmp_path: Path,
) -> None:
    from xsp.tracer.run.placement import child_spec
    from xsp.tracer.run.protocol import ChildSpec

    spec = LeveledSpec(
        out=tmp_path,
        profile=ProfileSpec(model="torchvision:resnet18"),
        level_sets=("M", "MF", "MFLG"),
        share_process=True,
    )
    sent = child_spec(spec, LevelSet("M"), "m", (LevelSet("MF"),))
    back = ChildSpec.from_argv(sent.to_argv())
    assert back == sent
    assert [run.levels for run in back.then] == ["MF"] and back.then[0].out == str(tmp_path / "MF")
    # MF calibrates (the shallowest with F); MFLG records the op shapes (the deepest)
    assert back.then[0].profile.calibrate and not back.then[0].profile.op_shapes
    assert not back.run.profile.calibrate


def _side_by_side_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a zoo model's processes warm up side by side; on the CPU they would share the
    workload's cores, so the runner starts them in turn there. The tests drive the GPU's way."""
    from xsp.tracer.run import runner

    monkeypatch.setattr(
        runner,
        "warms_up_side_by_side",
        lambda spec, hosts: [j for j, g in enumerate(hosts) if j and g],
    )


def test_side_by_side_processes_warm_up_together_and_measure_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _side_by_side_on_the_cpu(monkeypatch)
    spec = _squeezenet(tmp_path, ("M", "MF", "MFL"), overlap=True, share_process=True)
    result = run_leveled(spec)
    assert result.ok, result.failure
    runs = {run.levels: run.meta for run in open_measurement(spec.out)}
    # MFL started with M's process and waited at its gate before M switched its levels on
    assert runs["MFL"]["phases_ns"]["ready"] <= runs["M"]["phases_ns"]["levels_on"]
    assert runs["M"]["phases_ns"]["ready"] <= runs["M"]["phases_ns"]["levels_on"]
    # and it measured only once M's process (M, then MF) had ended
    assert runs["MFL"]["phases_ns"]["levels_on"] > runs["MF"]["finished_ns"]
    assert [entry.status for entry in result.runs] == ["ok", "ok", "ok"]


def test_a_failed_level_set_cancels_the_processes_warmed_up_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _side_by_side_on_the_cpu(monkeypatch)
    spec = _squeezenet(
        tmp_path, ("M", "MFL"), iterations=100_000, overlap=True, timeout_s=2, log_stderr=True
    )
    events: list[tuple[str, str]] = []
    result = run_leveled(spec, progress=lambda levels, phase, *_: events.append((levels, phase)))
    assert ("MFL", "start") in events and ("M", "ready") not in events
    assert [entry.levels for entry in result.runs] == ["M"]
    assert result.runs[0].timed_out is True
    assert not (spec.out / "MFL").exists() and not (spec.out / "MFL.stderr.log").exists()


def test_a_process_that_does_not_warm_up_in_time_starts_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.tracer.run import gates

    _side_by_side_on_the_cpu(monkeypatch)
    monkeypatch.setattr(gates, "READY_LIMIT_S", 0.0)  # none is ready that soon
    spec = _squeezenet(tmp_path, ("M", "MFL"), overlap=True)
    result = run_leveled(spec)
    assert result.ok, result.failure
    runs = {run.levels: run.meta for run in open_measurement(spec.out)}
    # started again once M had measured: it warmed up after M's levels came on
    assert runs["MFL"]["started_ns"] > runs["M"]["phases_ns"]["levels_on"]


def test_a_level_set_in_a_shared_process_ends_when_it_has_stored_or_the_process_ended() -> None:
    """The wait of the first of two level sets in one process: (0, not timed out) once it has
    stored its run, the process's own status once the process ended before that, and past its
    time limit the process is killed (both level sets go with it)."""
    from xsp.tracer.run.process import Stages

    calls: list[tuple[float | None, bool]] = []

    def process_wait(timeout: float | None, kill: bool = True) -> tuple[int, bool]:
        calls.append((timeout, kill))
        return (-9, True) if timeout == 0 and kill else (3, False)

    stored = Stages((LevelSet("M"), LevelSet("MF")))
    assert stored.wait(1, process_wait) is process_wait  # the last one waits for the process
    stored.store(0)
    assert stored.wait(0, process_wait)(0.1) == (0, False) and not calls
    ended = Stages((LevelSet("M"), LevelSet("MF")))
    ended.end()  # the process ended before M stored its run
    assert ended.wait(0, process_wait)(0.1) == (3, False) and calls == [(None, True)]
    late = Stages((LevelSet("M"), LevelSet("MF")))
    assert late.wait(0, process_wait)(0.01, kill=False) == (None, True)
    assert late.wait(0, process_wait)(0.01) == (-9, True) and calls[-1] == (0, True)
