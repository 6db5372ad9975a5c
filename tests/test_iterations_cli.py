"""``xsp run`` on unmodified inference scripts, end to end in subprocesses (as a user runs it)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from tests.test_cli import xsp
from xsp.core.store import open_measurement

#: An inference loop as people write it: no optimizer, no xsp marker. argv: forward passes.
INFER_SCRIPT = """
    import sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(int(sys.argv[1])):
            model(x)
    print("inferred", sys.argv[1])
"""

#: A module beside the serving script: ``answer`` is one request of three forward passes.
SERVE_LIB = """
    import torch

    def answer(model, x):
        with torch.no_grad():
            for _ in range(3):
                x = torch.cat([x[:, :4], model(x)], dim=1)
        return x
"""

SERVE_SCRIPT = """
    import torch
    from serve_lib import answer

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for _ in range(7):  # 1 warm-up, then 3 untraced and 3 traced requests in the MF process
        answer(model, torch.randn(1, 8))
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "R"
    base = ("run", "--levels", "M,MF", "--iterations", "3", "--warmup", "1", "--device", "cpu")
    return xsp(*base, "--out", str(out), *args), out


def test_an_unmodified_inference_script_gets_one_model_span_per_forward(tmp_path: Path) -> None:
    # the MF process runs an untraced forward pass before each traced one: 1 + 2 x 3 = 7
    done, out = _run(tmp_path, "--", "python", str(_write(tmp_path, "infer.py", INFER_SCRIPT)), "7")
    assert done.returncode == 0, done.stderr
    for run in open_measurement(out):
        assert run.meta["status"] == "ok" and run.meta["iteration_boundary"] == "root-module-call"
        rows = run.spans().to_pylist()
        steps = {r["span_id"] for r in rows if r["kind"] == "step"}
        assert len(steps) == 3, run.levels
        if run.levels == "MF":
            assert run.meta["interleaved"]["pairs"] == 3  # each traced pass after an untraced
            roots = [r for r in rows if r["kind"] == "module" and r["module_path"] == ""]
            assert sorted(r["parent_span_id"] in steps for r in roots) == [True] * 3
            root_ids = {r["span_id"] for r in roots}
            layers = [r for r in rows if r["kind"] == "module" and r["module_path"] != ""]
            assert len(layers) == 3 * 3 and all(r["parent_span_id"] in root_ids for r in layers)


def test_each_call_of_the_iteration_function_is_one_iteration(tmp_path: Path) -> None:
    _write(tmp_path, "serve_lib.py", SERVE_LIB)
    script = _write(tmp_path, "serve.py", SERVE_SCRIPT)
    done, out = _run(tmp_path, "--iteration-fn", "serve_lib.answer", "--", "python", str(script))
    assert done.returncode == 0, done.stderr
    for run in open_measurement(out):
        assert run.meta["iteration_boundary"] == "function:serve_lib.answer"
        rows = run.spans().to_pylist()
        steps = {r["span_id"] for r in rows if r["kind"] == "step"}
        assert len(steps) == 3
        if run.levels == "MF":  # three forward passes a request
            assert run.meta["interleaved"]["pairs"] == 3
            roots = [r for r in rows if r["kind"] == "module" and r["module_path"] == ""]
            assert len(roots) == 3 * 3 and all(r["parent_span_id"] in steps for r in roots)


def test_a_script_that_does_nothing_measurable_fails_once_and_stores_nothing(
    tmp_path: Path,
) -> None:
    script = _write(tmp_path, "nothing.py", "import torch\nprint(torch.ones(2) @ torch.ones(2))\n")
    done, out = _run(tmp_path, "--", "python", str(script))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "xsp:" in line]
    assert errors == [
        "xsp: error: level set M: error: 0 of 3 iterations measured: the program called no "
        "nn.Module with parameters and no optimizer.step(); mark its iterations with xsp.step() "
        "or name a function with --iteration-fn; nothing was stored"
    ]
    assert "xsp measurement" not in done.stdout and "spans stored" not in done.stderr
    assert not out.exists()


def test_iteration_fn_is_refused_for_a_zoo_model_and_a_bad_name() -> None:
    done = xsp("run", "--model", "torchvision:resnet18", "--iteration-fn", "a.b")
    assert done.returncode == 2 and "not of --model" in done.stderr
    done = xsp("run", "--iteration-fn", "generate", "--", "python", "-c", "pass")
    assert done.returncode == 2 and "give MODULE.QUALNAME" in done.stderr
