"""The package's shape, checked from the source: one top-level name, stages that import one way,
no import cycles, and store-only commands that never load torch.

The import graph is read statically from every ``import`` in ``xsp/`` (function-level imports
included: a lazy import is still a dependency), so a test fails the day an arrow turns around.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "xsp"
STAGE_FOLDERS = ("core", "tracer", "collector", "analysis", "campaign")
#: Code that may load torch or the capture machinery: never reached from the store readers.
CAPTURE = ("xsp.tracer.capture", "xsp.tracer.run", "xsp.tracer.workloads", "torch")


def _modules() -> dict[str, Path]:
    found = {}
    paths = [
        Path(folder) / file
        for folder, _, files in os.walk(PACKAGE)
        for file in files
        if file.endswith(".py")
    ]
    for path in paths:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> Iterator[str]:
    """Every module ``name`` imports, as absolute dotted names."""
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in MODULES else node.module


def _graph() -> dict[str, set[str]]:
    return {name: set(_imports(name)) for name in MODULES}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_one_top_level_name() -> None:
    """The stage folders are imported only as xsp.<stage>: a bare ``import tracer`` would load a
    second copy of every module next to xsp.tracer's."""
    for name in MODULES:
        for target in _imports(name):
            assert target.split(".")[0] not in STAGE_FOLDERS, f"{name} imports {target}"
    for folder in STAGE_FOLDERS:  # real folders, which coverage and import-graph tools see
        assert (PACKAGE / folder).is_dir() and not (PACKAGE / folder).is_symlink()
        assert not (ROOT / folder).exists(), f"a top-level {folder}/ beside xsp/{folder}"


def test_no_import_cycles() -> None:
    graph = {name: {t for t in targets if t in MODULES} for name, targets in _graph().items()}
    cycles = sorted(name for name in graph if name in _reach(graph, name))
    assert cycles == []


def _direct(name: str) -> set[str]:
    """The xsp modules and third-party top-level names ``name`` imports itself."""
    return {t if t.startswith("xsp") else t.split(".")[0] for t in _imports(name)}


def _package(prefix: str) -> list[str]:
    return sorted(n for n in MODULES if n == prefix or n.startswith(prefix + "."))


@pytest.mark.parametrize("name", _package("xsp.core"))
def test_core_imports_nothing_else_of_xsp_and_no_torch(name: str) -> None:
    """Every stage builds on the core, so the core may lean on none of them, nor load torch."""
    reached = _reach(_graph(), name)
    assert not {r for r in reached if r.startswith("xsp.") and not r.startswith("xsp.core")}
    assert not {r for r in reached if r.split(".")[0] == "torch"}


@pytest.mark.parametrize(
    ("stage", "allowed"),
    [
        ("xsp.tracer.convert", ("xsp.core", "xsp.tracer.convert")),
        ("xsp.analysis", ("xsp.core", "xsp.analysis")),
        ("xsp.collector", ("xsp.core", "xsp.collector")),
    ],
)
def test_a_stage_imports_only_the_core_and_itself(stage: str, allowed: tuple[str, ...]) -> None:
    for name in _package(stage):
        others = {t for t in _direct(name) if t.startswith("xsp") and not t.startswith(allowed)}
        assert not others, f"{name} imports {sorted(others)}"


def _folder(name: str) -> str:
    """The package a module sits in (a package's ``__init__`` is the package itself)."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def test_no_two_packages_import_each_other() -> None:
    """Package by package the arrows point one way, a package and the modules beside its
    sub-packages included: each can be read, changed and tested above what it imports."""
    arrows = {
        (_folder(name), _folder(target))
        for name, targets in _graph().items()
        for target in targets
        if target in MODULES and _folder(name) != _folder(target)
    }
    assert sorted({tuple(sorted(a)) for a in arrows if a[::-1] in arrows}) == []


def test_capture_never_imports_the_analyses_or_the_collector() -> None:
    graph = _graph()
    for name in MODULES:
        if name.startswith("xsp.tracer.capture"):
            reached = _reach(graph, name)
            assert not {r for r in reached if r.startswith(("xsp.analysis", "xsp.collector"))}


@pytest.mark.parametrize(
    "start",
    sorted(
        n
        for n in MODULES
        if n.startswith(("xsp.analysis", "xsp.collector")) or n == "xsp.campaign.report"
    ),
)
def test_store_readers_never_reach_torch_or_capture(start: str) -> None:
    reached = _reach(_graph(), start)
    assert not {r for r in reached if r.startswith(CAPTURE)}, start


#: The OTLP codec's modules: what the collector imports, bound for a torch-free core.
OTLP_CODEC = sorted(
    n for n in MODULES if n.startswith("xsp.core.otlp.") and n != "xsp.tracer.export.otlp_layout"
)
#: The viewer's layout on the wire, which only the encoders' callers choose.
VIEWER_LAYOUT = (
    "xsp.tracer.export.otlp_layout",
    "xsp.tracer.export.view",
    "xsp.tracer.export.kernel_names",
)


@pytest.mark.parametrize("start", OTLP_CODEC)
def test_the_otlp_codec_knows_no_viewer_layout(start: str) -> None:
    """The codec reaches neither the layout nor capture, run or the analyses (nor the package's
    facade, which loads the layout)."""
    reached = _reach(_graph(), start)
    assert not {r for r in reached if r.startswith((*VIEWER_LAYOUT, *CAPTURE, "xsp.analysis"))}
    assert "xsp.core.otlp" not in reached


@pytest.mark.parametrize(
    "command",
    [
        ["summary", "benchmarks/data/r50-b64-train"],
        ["analyze", "benchmarks/data/r50-b64-train", "--rows", "1"],
        ["export", "benchmarks/data/r50-b64-train/M", "--format", "chrome", "-o", "{tmp}/t.json"],
        ["campaign", "sql", "benchmarks/results/campaign-h200", "SELECT count(*) FROM jobs"],
        [
            "campaign",
            "report",
            "benchmarks/results/campaign-h200",
            "--no-run-reports",
            "-o",
            "{tmp}/c.html",
        ],
    ],
)
def test_store_only_commands_load_no_torch(command: list[str], tmp_path: Path) -> None:
    """What `python -X importtime -m xsp summary RUN` shows: no torch among the imports."""
    argv = [part.replace("{tmp}", str(tmp_path)) for part in command]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xsp", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] == "torch"}
    assert not {m for m in imported if m.startswith(CAPTURE[:3])}


def test_the_stage_folders_are_not_installed_as_top_level_packages() -> None:
    """Installed, xsp puts one name into site-packages: outside the checkout, `import tracer`
    (or analysis, campaign, collector) finds nothing, while xsp.tracer does."""
    probe = "; ".join(
        [
            "import importlib.util as u",
            "import xsp.core.schema",
            f"print([n for n in {STAGE_FOLDERS!r} if u.find_spec(n) is not None])",
        ]
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, env=env
    )
    if done.returncode != 0 and "No module named 'xsp'" in done.stderr:
        pytest.skip("xsp is not installed in this interpreter (make setup installs it)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
