"""``xsp verify`` and the fixes it applies, on the CPU.

The end-to-end test measures one unmodified training script that is input-bound (its
DataLoader has no workers and each sample takes 10 ms to load: 40 ms a batch of 4) and syncs
the host each step (``loss.item()``), then verifies it: the input-bound rule's fix (DataLoader
workers) is measured in paired rounds, the host-syncs rule needs a code change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from xsp.analysis.suggestions.rules import RULES
from xsp.campaign import verify as verifying
from xsp.campaign.paired import paired_gain
from xsp.cli import main as cli_main
from xsp.core.errors import ConfigError
from xsp.tracer.capture.iterations import RootFinder
from xsp.tracer.spec import ProfileSpec
from xsp.tracer.workloads import numerics
from xsp.tracer.workloads.fixes import FIXES, AppliedFixes, loader_workers

ROOT = Path(__file__).resolve().parents[1]

SAMPLE_S = 0.010
BATCH = 4
LOADER_MS = 1e3 * SAMPLE_S * BATCH  # one batch, loaded in the training process: 40 ms

SCRIPT = f"""
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 80  # 20 batches: 2 warm-up, then 8 untraced and 8 traced in the MF process
        def __getitem__(self, i):
            time.sleep({SAMPLE_S})  # to read and decode one sample
            return torch.randn(16), torch.randn(1)

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for x, y in DataLoader(Slow(), batch_size={BATCH}):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a host sync each step
    print("final loss", losses[-1])  # the program's own output: never inside --json's
"""


def xsp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "xsp", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The script measured at M,MF from its own directory (relative path), then verified in
    two rounds."""
    work = tmp_path_factory.mktemp("verify")
    (work / "train.py").write_text(textwrap.dedent(SCRIPT))
    made = xsp(
        "run", "--levels", "M,MF", "--iterations", "8", "--warmup", "2", "--out", "R",
        "--", "python", "train.py",
        cwd=work,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = xsp("verify", str(work / "R"), "--rounds", "2", "--json", cwd=ROOT)  # elsewhere
    assert done.returncode == 0, done.stderr
    return work / "R", json.loads(done.stdout)


def test_the_input_bound_fix_takes_the_loader_time_off_the_step(verified: tuple) -> None:
    """With W workers a batch that took 40 ms in the training process is ready every 40/W ms:
    the step loses 40 (1 - 1/W) ms, and at most the whole 40 ms of loading."""
    run, document = verified
    rows = {row["rule"]: row for row in document["rows"]}
    assert all(tuple(row) == verifying.ROW_KEYS for row in document["rows"])
    found = rows["input-bound"]
    assert found["status"] == "measured" and found["rounds"] == 2
    assert found["numerics_change"] is False
    expected = LOADER_MS * (1 - 1 / loader_workers())
    gain = found["measured_gain_ms_per_iteration"]
    low, high = found["measured_gain_ci_ms"]
    assert 0.6 * expected < gain < 1.15 * LOADER_MS, (gain, expected)
    assert 0 < low <= gain <= high
    assert 0 < found["measured_gain_pct"] < 100
    assert found["predicted_gain_ms_per_iteration"] > 0.8 * LOADER_MS  # all the loading
    assert found["evidence"] == str(run.resolve() / "verify" / "input-bound")
    for k in (1, 2):
        for side in ("base", "fixed"):
            assert (
                run / "verify" / "input-bound" / f"round-{k}" / side / "M" / "run.json"
            ).exists()
    details = document["details"]["input-bound"]
    assert [(r["round"], r["side"]) for r in details["runs"]] == [
        (1, "base"), (1, "fixed"), (2, "fixed"), (2, "base"),
    ]  # fmt: skip
    # the mechanism: the fixed script traced at MF, its loader's batches from the workers
    mechanism = run / "verify" / "input-bound" / "mechanism" / "MF"
    loading = [s for s in _spans(mechanism) if s["kind"] == "data_loading"]
    assert loading and {s["data_workers"] for s in loading} == {loader_workers()}
    # the script draws its samples unseeded: no two runs see the same first batch
    assert {r["comparable"] for r in details["numerics"]["rounds"]} == {False}
    assert details["numerics"]["relative_l2"] is None
    assert json.loads((run / "verify" / "verify.json").read_text()) == document


def _spans(run_dir: Path) -> list[dict]:
    from xsp.core.store import open_run

    return open_run(run_dir).spans().to_pylist()


def test_a_host_sync_needs_a_code_change(verified: tuple) -> None:
    run, document = verified
    found = {row["rule"]: row for row in document["rows"]}["host-syncs"]
    assert found["status"] == "needs a code change"
    assert found["measured_gain_ms_per_iteration"] is None and found["rounds"] == 0
    assert found["evidence"] is None
    assert not (run / "verify" / "host-syncs").exists()


def test_the_terminal_line(verified: tuple) -> None:
    _, document = verified
    rows = {row["rule"]: row for row in document["rows"]}
    details = document["details"]
    results = {
        rule: verifying.RuleResult(row, details[rule]["fix"], details[rule]["advice"], "", "")
        for rule, row in rows.items()
    }
    row = rows["input-bound"]
    low, high = row["measured_gain_ci_ms"]
    assert verifying.summary_line(results["input-bound"]).startswith(
        f"input-bound: estimated {row['predicted_gain_ms_per_iteration']:.2f} ms, measured "
        f"{row['measured_gain_ms_per_iteration']:.2f} ms ± {(high - low) / 2:.2f} (2 rounds)"
    )
    assert verifying.summary_line(results["host-syncs"]).startswith(
        "host-syncs: needs a code change: keep values on the GPU"
    )


def _one_line_error(done: Result, text: str) -> None:
    output = done.stderr
    assert done.exit_code == 2, output
    assert output.count("\n") == 1 and output.startswith("xsp: error: ") and text in output


def test_bad_input_says_why_in_one_line(verified: tuple, tmp_path: Path) -> None:
    run, _ = verified
    runner = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(runner.invoke(cli_main, ["verify", str(empty)]), "no manifest.json")
    _one_line_error(runner.invoke(cli_main, ["verify", str(tmp_path / "nope")]), "no such")
    no_spec = tmp_path / "no-spec"
    shutil.copytree(run / "MF", no_spec / "MF")
    manifest = json.loads((run / "manifest.json").read_text())
    (no_spec / "manifest.json").write_text(json.dumps({**manifest, "spec": None}))
    _one_line_error(runner.invoke(cli_main, ["verify", str(no_spec)]), "has no spec")
    gone = tmp_path / "gone"
    for levels in ("M", "MF"):
        shutil.copytree(run / levels, gone / levels)
    spec = {**manifest["spec"], "command": ["python", "gone.py"]}
    (gone / "manifest.json").write_text(json.dumps({**manifest, "spec": spec}))
    _one_line_error(
        runner.invoke(cli_main, ["verify", str(gone)]),
        f"cannot re-run the workload of {gone}: script not found: gone.py",
    )
    # a verification's own run of the fixed script at M: nothing to suggest there
    fixed = run / "verify" / "input-bound" / "round-1" / "fixed"
    _one_line_error(runner.invoke(cli_main, ["verify", str(fixed)]), "no suggestions to verify")
    # a script runs once a process: only a zoo model is built twice in one
    _one_line_error(
        runner.invoke(cli_main, ["verify", str(run), "--in-process"]),
        "ran a command (python train.py): --in-process times a zoo model built twice",
    )


def test_paired_gain_by_hand() -> None:
    """Rounds of 10 and 12 ms steps against 7 and 9: 3 ms off an 11 ms step, and no spread to
    resample; a noisy side widens the interval around the same gain."""
    gain = paired_gain([[10, 10, 10], [12, 12, 12]], [[7, 7, 7], [9, 9, 9]])
    assert gain.gain_ms == pytest.approx(3.0) and gain.ci_ms == pytest.approx((3.0, 3.0))
    assert gain.gain_pct == pytest.approx(100 * 3 / 11) and gain.rounds == 2
    noisy = paired_gain([[9, 11, 10, 10]], [[6, 8, 7, 7]])
    assert noisy.gain_ms == pytest.approx(3.0)
    assert 1.5 < noisy.ci_ms[0] < 3.0 < noisy.ci_ms[1] < 4.5
    with pytest.raises(ValueError, match="pair each round"):
        paired_gain([[1.0]], [])


def _conv_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
    ).eval()


def test_channels_last_converts_the_first_called_module_and_its_4d_inputs() -> None:
    model = _conv_model()
    x = torch.randn(2, 3, 16, 16)
    expected = model(x)
    seen: list[bool] = []
    model[3].register_forward_pre_hook(
        lambda _, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    call = torch.nn.Module.__call__
    fixes = AppliedFixes(["channels_last"], "cpu").apply()
    RootFinder(fixes.attach)  # as the level-set process of a script does
    assert not model[0].weight.is_contiguous(memory_format=torch.channels_last)
    out = model(x)  # the first module call: the root found, converted, its input converted
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model[3].weight.is_contiguous(memory_format=torch.channels_last)
    assert seen == [True] and fixes.errors == []
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.nn.Module.__call__ is call  # unwrapped again
    model(x.contiguous())  # each call's input is converted again
    assert seen == [True, True]


def _first_output(tmp_path: Path, fixes: list[str], name: str) -> dict:
    """The numerics probe's record of a seeded conv model's first forward pass with ``fixes``
    applied, as a level-set process applies them: the fixes first, then the probe."""
    model, path = _conv_model(), tmp_path / name
    torch.manual_seed(1)
    AppliedFixes(fixes, "cpu").apply().attach(model)
    numerics.record(model, path)
    model(torch.randn(2, 3, 16, 16))
    model(torch.randn(2, 3, 16, 16))  # recorded once
    return json.loads(path.read_text())


def test_the_numerics_probe_tells_a_layout_change_from_bf16(tmp_path: Path) -> None:
    base = _first_output(tmp_path, [], "base.json")
    assert base["output_values"] == 2 * 4 * 12 * 12 and len(base["output_sample"]) == 1152
    layout = numerics.compare(base, _first_output(tmp_path, ["channels_last"], "cl.json"))
    assert layout["comparable"] and layout["relative_l2"] < 1e-6
    bf16 = numerics.compare(base, _first_output(tmp_path, ["bf16"], "bf16.json"))
    assert bf16["comparable"] and 1e-4 < bf16["relative_l2"] < 0.05
    other = {**base, "input_checksum": [base["input_checksum"][0] + 1.0]}
    assert numerics.compare(other, base) == {
        "comparable": False,
        "why": "the first forward pass's inputs differ (unseeded)",
    }


def test_fixes_say_whether_they_change_numerics() -> None:
    assert FIXES["tf32"].changes_numerics and FIXES["bf16"].changes_numerics
    assert not FIXES["channels_last"].changes_numerics
    assert not FIXES["dataloader"].changes_numerics
    assert {r.fix for r in RULES if r.fix is not None} <= set(FIXES)


def test_bf16_autocasts_the_root_forward_only() -> None:
    model = torch.nn.Linear(4, 4)
    AppliedFixes(["bf16"], "cpu").attach(model)
    out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert torch.nn.functional.mse_loss(out.float(), torch.zeros(2, 4)).dtype == torch.float32


def test_the_launch_bound_rule_is_verified_with_cuda_graphs() -> None:
    """Its estimate replays the step as one CUDA graph: the fix that matches is compile's
    reduce-overhead mode, applied to the root module in place (the call that found it runs
    compiled already)."""
    assert verifying.fix_for("launch-bound") == "cuda_graphs"
    model = torch.nn.Linear(4, 4)
    fixes = AppliedFixes(["cuda_graphs"], "cpu")
    fixes.attach(model)
    assert fixes.errors == [] and model._compiled_call_impl is not None


def test_the_allocator_fix_sets_its_conf_once_and_keeps_the_programs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from xsp.tracer.workloads.fixes import ALLOC_CONF

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert AppliedFixes(["alloc_conf"], "cpu").apply().errors == []
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ALLOC_CONF == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    errors = AppliedFixes(["alloc_conf"], "cpu").apply().errors
    assert errors == [
        "fix alloc_conf could not apply: RuntimeError: PYTORCH_CUDA_ALLOC_CONF is set already "
        "('max_split_size_mb:64'); left as it is"
    ]
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"


def test_the_dataloader_fix_fills_in_only_what_a_loader_left_at_its_default() -> None:
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    original = DataLoader.__init__
    data = TensorDataset(torch.randn(8, 2))
    try:
        AppliedFixes(["dataloader"], "cpu").apply()
        built = DataLoader(data, 4)
        assert (built.num_workers, built.persistent_workers) == (loader_workers(), True)
        assert built.prefetch_factor == 2 and built.pin_memory is False  # no pinning on CPU
        positional = DataLoader(data, 4, False, None, None, 0)  # num_workers=0 by position
        assert positional.num_workers == loader_workers()
        own = DataLoader(data, batch_size=4, num_workers=1)
        assert (own.num_workers, own.persistent_workers) == (1, False)

        class Stream(IterableDataset):
            def __iter__(self):  # type: ignore[no-untyped-def]
                return iter(range(4))

        assert DataLoader(Stream()).num_workers == 0  # each worker would yield it all
    finally:
        DataLoader.__init__ = original  # type: ignore[method-assign]


def test_fixes_are_named_in_the_spec_and_on_the_command_line() -> None:
    assert ProfileSpec(fixes=("tf32", "tf32", "bf16")).fixes == ("tf32", "bf16")
    with pytest.raises(ConfigError, match="unknown fix 'fast'"):
        ProfileSpec(fixes=("fast",))
    help_text = CliRunner().invoke(cli_main, ["run", "--help"]).output
    assert all(name in " ".join(help_text.split()) for name in FIXES)
    refused = CliRunner().invoke(cli_main, ["run", "--fix", "fast", "--model", "x:y"])
    _one_line_error(refused, "unknown fix 'fast'")


def test_the_measurement_spec_round_trips_its_fixes() -> None:
    from xsp.core.levelset import LevelSet
    from xsp.tracer.spec import RunSpec

    spec = RunSpec(LevelSet("M"), ProfileSpec(model="torchvision:resnet18", fixes=("tf32",)))
    assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.skipif(torch.cuda.is_available(), reason="here it would re-run ResNet-50")
def test_a_cuda_measurement_cannot_re_run_on_a_host_without_a_gpu() -> None:
    """The committed H200 measurement (its spec says --device cuda) has suggestions, and says in
    one line, before anything runs, why it cannot run here."""
    run = ROOT / "benchmarks" / "data" / "r50-b64-train"
    refused = CliRunner().invoke(cli_main, ["verify", str(run), "--rule", "layout-transposes"])
    _one_line_error(refused, f"cannot re-run the workload of {run}: --device cuda: ")
    assert not (run / "verify").exists()


def test_a_zoo_models_rounds_fork_from_one_server_and_apply_their_fix(tmp_path: Path) -> None:
    original = verifying.Original(
        root=tmp_path,
        profile=ProfileSpec(
            iterations=3, warmup=1, device="cpu", model="torchvision:resnet18", batch_size=2
        ),
        level_sets=(verifying.UNTRACED,),
        env={},
        cwd=tmp_path,
    )
    runs = [
        verifying._measure(
            original,
            fixes,
            verifying.UNTRACED,
            tmp_path / side,
            side,
            verifying._Counter("rule", 2, None),
        )
        for side, fixes in (("base", ()), ("fixed", ("channels_last",)))
    ]
    for run in runs:
        assert run.failure is None and len(run.steps_ms) == 3
        manifest = json.loads((run.path / "manifest.json").read_text())
        assert manifest["spec"]["fork_server"] is True
    fixed = json.loads((tmp_path / "fixed" / "M" / "run.json").read_text())
    assert not fixed.get("errors")  # the fix applied in the forked process
    assert fixed["resource"]["xsp.fixes"] == "channels_last"


def test_a_campaign_verify_step_gives_the_what_if_table(verified: tuple, tmp_path: Path) -> None:
    """A campaign directory with two finished jobs: the script's measurement (its host-syncs
    rule verified: a code change, nothing to run) and the fixed script's M run (nothing to
    suggest: recorded with its reason). The what-if table of the script's verification names
    the fix, the job and the change of the step."""
    from xsp.campaign.spec import CampaignSpec, Job
    from xsp.campaign.store import CampaignStore
    from xsp.campaign.whatif import verify_campaign, what_if, what_if_line

    run, verified_document = verified
    spec = CampaignSpec("t", ["script:train.py", "script:fixed"], [BATCH], ["train"])
    campaign = CampaignStore(tmp_path / "C")
    campaign.begin(spec)
    script, fixed = Job("script:train.py", "train", BATCH), Job("script:fixed", "train", BATCH)
    shutil.copytree(run, campaign.run_dir(script), ignore=shutil.ignore_patterns("verify"))
    fixed_run = run / "verify" / "input-bound" / "round-1" / "fixed"
    shutil.copytree(fixed_run, campaign.run_dir(fixed))
    for job in (script, fixed):
        campaign.save({"job": job.id, "status": "ok"})
    document = verify_campaign(campaign, rules=["host-syncs"])
    assert json.loads((campaign.root / "verify.json").read_text()) == document
    first, second = document["jobs"]
    assert first["status"] == "verified"
    assert [(r["rule"], r["status"]) for r in first["rows"]] == [
        ("host-syncs", "needs a code change")
    ]
    assert second["status"] == "not verified" and "no suggestion host-syncs" in second["why"]
    assert what_if(document) == []
    measured = {"jobs": [{**first, "rows": verified_document["rows"]}]}
    [row] = what_if(measured)
    assert (row["fix"], row["job"]) == ("dataloader", f"script:train.py b{BATCH} train")
    assert row["step_change_pct"] < -20  # 40 ms of loading in a ~42 ms step, halved or more
    assert what_if_line(row).startswith(f"dataloader: {row['step_change_pct']:+.1f}% on script:")
