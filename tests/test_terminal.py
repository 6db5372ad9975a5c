"""What a user sees in a terminal: ``xsp analyze`` and ``xsp diff`` fit 80 columns without
cards or names cut inside a word, their headline and warnings on standard output, a crashing
script's error once, a reused ``--out`` refused (issue 52, item 5)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from xsp.analysis.figures.present import KERNEL_COLUMNS, short_kernel
from xsp.cli.fit import Column, Kind, fit, shorten
from xsp.cli.render import NAMESAKES, kernel_labels

ROOT = Path(__file__).resolve().parents[1]
R50 = ROOT / "benchmarks/data/replay-h200/r50-b64-train"
#: The README's diff example (docs/diff.md): NCHW against channels_last.
NCHW = ROOT / "benchmarks/data/r50-b64-train"
CHANNELS_LAST = ROOT / "benchmarks/data/r50-b64-train-cl"
#: Where a shortened name may be cut (``xsp.cli.fit``).
BOUNDARY = "./ _-:"


def xsp(*args: str, columns: int = 80, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "xsp", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _unwrapped(text: str) -> str:
    """The lines as one text, however wrapped."""
    return " ".join(text.split())


def _cells(text: str) -> list[str]:
    """Every cell of the tables in ``text`` (their rows' text between the rules)."""
    return [
        cell.strip()
        for line in text.splitlines()
        if line.startswith("│")
        for cell in line.strip("│").split("│")
        if cell.strip()
    ]


def _cards(text: str) -> list[str]:
    """The lines that opened a card (one block a row): ``1.``, ``2.``, ..."""
    return [line for line in text.splitlines() if re.fullmatch(r"\d+\.\s*", line)]


def _cut_whole(cell: str, names: set[str]) -> bool:
    """Whether ``cell`` is a name shown whole, or cut at its boundaries: ``layer2.0.…`` keeps
    whole segments, ``…nchwToNhwcKernel<…>`` starts after a boundary, and a kernel's
    ``…vectorized_…<…, 4, …>`` lost whole words at both ends of its name (an ellipsis inside
    ``<…>`` is the name's own: elided template arguments)."""
    text = cell.replace("<…>", "<>")
    whole = {n.replace("<…>", "<>") for n in names}
    if "…" not in text or text in whole:  # a whole name: its ``…`` stand for template arguments
        return True
    pattern, depth, cuts = "", 0, 0
    for char in text:
        depth += (char == "<") - (char == ">")
        if char == "…" and depth == 0:  # a cut: whole words went here
            pattern, cuts = pattern + "(.+)", cuts + 1
        else:
            pattern += re.escape(char)
    for name in whole:
        found = re.fullmatch(pattern, name)
        if found and all(_cut_at_boundaries(name, *found.span(g)) for g in range(1, cuts + 1)):
            return True
    return False


def _cut_at_boundaries(name: str, start: int, end: int) -> bool:
    """Whether ``name[start:end]`` begins and ends between words (or where a kernel's template
    arguments or namesake number begin)."""
    begins = start == 0 or name[start - 1] in BOUNDARY
    ends = end == len(name) or name[end - 1] in BOUNDARY or name[end] in "< "
    return begins and ends


def test_analyze_prints_the_answer_in_under_100_lines_at_80_columns() -> None:
    """The committed ResNet-50 store printed 1,382 lines at 80 columns, 14 tables as cards.
    Now: the summary, the verdict, the replay's check and warnings, then the key tables."""
    done = xsp("analyze", str(R50))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 100, len(lines)
    assert max(len(line) for line in lines) <= 80
    assert not _cards(done.stdout)
    text = _unwrapped(done.stdout)
    order = [
        "xsp measurement",
        "unchecked: GPU-bound: 77% gpu compute",  # the verdict
        "reconstructed: 99,740 spans, model latency median 32.960 ms",
        "replayed step 32.923 ms against M's 33.877 ms (-2.8%)",
        "xsp: warning: unchecked in-process",
        "xsp: warning: unchecked across processes",
        "Suggestions",
        "Where the step goes",
        "Layers by GPU time",
        "Kernels by name (A10)",
        "18 more analyses",
    ]
    at = [text.index(phrase) for phrase in order]
    assert at == sorted(at)
    assert "5 of 20 rows shown" in text  # the key tables' top rows, the count said
    assert "Share min (%), Share max (%)" in text  # what was left out, named


def test_headline_and_warnings_go_to_stdout_so_a_file_keeps_them(tmp_path: Path) -> None:
    """``xsp analyze RUN > out.txt`` kept neither the headline nor the warnings (stderr)."""
    out = tmp_path / "out.txt"
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    with out.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "xsp", "analyze", str(R50)],
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=600,
        )
    assert done.returncode == 0 and done.stderr == ""
    kept = _unwrapped(out.read_text())
    assert "reconstructed: 99,740 spans" in kept and "replayed step 32.923 ms" in kept
    assert kept.count("xsp: warning:") == 2


def test_all_prints_every_table_as_a_table() -> None:
    done = xsp("analyze", str(R50), "--all")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not _cards(done.stdout)
    analyses = json.loads(xsp("analyze", str(R50), "--json").stdout)["analyses"]
    shown = {"level_sets", "layer_info"}  # in the summary / too wide for a terminal
    for key, section in analyses.items():
        if key not in shown and (section["rows"] or key == "hardware_counters"):
            assert section["title"] in done.stdout, key
    assert "more analyses" not in done.stdout


def test_no_name_is_cut_inside_a_word() -> None:
    """``layer2.0.downsampl/e.0`` wrapped inside a word; now a name is whole or cut at a
    boundary, an ellipsis where the part went."""
    done = xsp("analyze", str(R50), "--all")
    analyses = json.loads(xsp("analyze", str(R50), "--json").stdout)["analyses"]
    names = {
        short_kernel(value, 1000) if key in KERNEL_COLUMNS else value
        for section in analyses.values()
        for row in section["rows"]
        for key, value in row.items()
        if isinstance(value, str)
    }
    names |= {  # the kernels as the terminal names them whole: namesakes told apart
        label
        for section in analyses.values()
        for key in KERNEL_COLUMNS & set(section["rows"][0] if section["rows"] else ())
        for label in kernel_labels([row[key] for row in section["rows"]])
    }
    cells = _cells(done.stdout)
    assert "layer2.0.downsample.0" in cells
    cut = [c for c in cells if "…" in c.replace("<…>", "")]
    assert cut  # kernel names at 80 columns
    assert [c for c in cut if not _cut_whole(c, names)] == []


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The cells of each row of the table printed under ``title``."""
    lines = text.splitlines()
    start = lines.index(title)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            return rows
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def _words_in_order(shown: str, name: str) -> bool:
    """Whether every word of ``shown`` (between its ellipses and punctuation) is in the real
    kernel ``name``, in order: the shown name is a readable part of the real one."""
    at = 0
    for word in re.findall(r"\w+", shown):
        at = name.find(word, at)
        if at < 0:
            return False
        at += len(word)
    return True


def test_kernels_of_one_name_read_apart() -> None:
    """``cudnn::bn_bw_1C11_kernel_new<…>`` was printed three times in the kernels table, told
    apart only by template arguments the terminal elided; now each kernel reads differently,
    by the arguments that tell it apart, as the HTML report names it (``distinct_kernels``)."""
    rows = json.loads(xsp("analyze", str(R50), "--json").stdout)["analyses"]["kernels_by_name"]
    real = [row["kernel"] for row in rows["rows"]]
    assert sum(short_kernel(n, 1000) == "cudnn::bn_bw_1C11_kernel_new<…>" for n in real) == 3
    for columns in (80, 160):
        done = xsp("analyze", str(R50), "--all", columns=columns)
        shown = [row[0] for row in _table_rows(done.stdout, "Kernels by name (A10)")]
        assert len(shown) == 15, columns
        assert len(set(shown)) == 15, shown  # every kernel shown is a different kernel
        assert all(_words_in_order(s, n) for s, n in zip(shown, real, strict=False)), shown
        assert NAMESAKES in _unwrapped(done.stdout)
    namesakes = [
        "cudnn::bn_bw_1C11_kernel_new<…, 128, …>",
        "cudnn::bn_bw_1C11_kernel_new<…, 32, …>",
        "cudnn::bn_bw_1C11_kernel_new<…, 512, …>",
    ]
    assert [s for s in shown if s.startswith("cudnn::bn_bw_1C11_kernel_new")] == namesakes
    # the HTML report's table names them alike
    from xsp.analysis.report import html_table

    page = html_table(pa.table({"kernel": real}))
    assert [n for n in namesakes if f">{html.escape(n)}</span>" in page] == namesakes


def test_the_suggestion_is_whole_at_80_and_160_columns() -> None:
    for columns in (80, 160):
        done = xsp("analyze", str(R50), columns=columns)
        assert "model.to(memory_format=torch.channels_last)" in done.stdout, columns
        assert max(len(line) for line in done.stdout.splitlines()) <= columns


def test_the_time_line_fits_80_columns() -> None:
    """154 characters on one line; now split after a comma, each figure with its unit."""
    done = xsp("summary", str(R50))
    at = next(i for i, line in enumerate(done.stdout.splitlines()) if line.startswith("time:"))
    lines = done.stdout.splitlines()[at : at + 2]
    assert lines == [
        "time: 3 level-set processes 32.7 s: start-up 25.0 s (77%), warm-up 2.2 s (7%),",
        "  levels on 2.0 s (6%), traced 2.4 s (7%), finish 0.7 s (2%), exit 0.3 s (1%)",
    ]


def test_diff_fits_80_columns_without_cards() -> None:
    """The README's example printed 348 lines of cards at 80 columns."""
    done = xsp("diff", str(NCHW), str(CHANNELS_LAST))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 100 and max(len(line) for line in lines) <= 80
    assert not _cards(done.stdout)
    text = _unwrapped(done.stdout)
    # the kernels' table leaves the change in % and the calls out, and says so
    assert "left out to fit 80 columns: Change (%), Calls" in text
    assert "faster, only before" in done.stdout  # a verdict whole on its row
    assert "verdicts: bootstrap" in text and done.stderr.count("\n") <= 2  # absent sections


def test_a_program_line_keeps_its_file_line_and_function() -> None:
    """The program-lines table cut every row to ``…/site-pack ages/…``."""
    where = "/work/main/.venv/lib/python3.11/site-packages/torchvision/models/resnet.py"
    sources = [f"{where}:96 BasicBlock.forward", f"{where}:271 ResNet._forward_impl"]
    columns = [
        Column("Source", sources, Kind.PATH, 0),
        Column("Ops per iteration", ["64", "2"], Kind.NUMBER, 2),
        Column("GPU (ms)", ["0", "0"], Kind.NUMBER, 1),
        Column("Host (ms)", ["21.848", "7.254"], Kind.NUMBER, 1),
        Column("Share (%)", ["0", "0"], Kind.NUMBER, 0),
    ]
    fitted = fit(columns, 80)
    # the numbers 7 ("Ops per" / "iter"), 4, 6 and 5 wide once their headers wrap, 16 of rules
    # and padding: 42 left for the paths, shortened at a "/" to 40 and 36 characters
    assert fitted.widths == [40, 7, 4, 6, 5] and fitted.dropped == []
    shown = [shorten(s, fitted.widths[0], Kind.PATH) for s in sources]
    assert shown == [
        "…/models/resnet.py:96 BasicBlock.forward",
        "…/resnet.py:271 ResNet._forward_impl",
    ]
    assert shorten(sources[0], 16, Kind.PATH) == "…/resnet.py:96"  # the function goes first


def test_a_kernel_keeps_what_tells_it_apart_when_shortened() -> None:
    """A kernel is cut as the HTML report cuts it (``cut_kernel``): its namespaces go from the
    left, then its end where a word begins; its template arguments and a number stay whole, or
    two kernels of one name would read alike again. The terminal cut the end's words from the
    left (``…g1_execute_segment_k_on_kernel__5x_cudnn``) where the report kept the start
    (``sm90_xmma_gemm_f32f32_…``): one kernel read two ways."""
    label = "cudnn::bn_bw_1C11_kernel_new<…, 128, …>"  # 39 wide
    assert shorten(label, 36, Kind.KERNEL) == "…bn_bw_1C11_kernel_new<…, 128, …>"
    assert shorten(label, 30, Kind.KERNEL) == "…bn_bw_1C11_…<…, 128, …>"
    assert shorten(label, 1, Kind.KERNEL) == "…bn_…<…, 128, …>"  # its shortest form
    assert shorten("k_one_two<…> #2", 8, Kind.KERNEL) == "k_…<…> #2"
    cudnn = (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1"
        "_execute_segment_k_on_kernel__5x_cudnn"
    )
    assert shorten(cudnn, 28, Kind.KERNEL) == "sm90_xmma_gemm_f32f32_…"
    assert short_kernel(cudnn).startswith("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_")  # the report


def test_columns_go_by_priority_and_prose_keeps_its_words() -> None:
    advice = "use channels_last: model.to(memory_format=torch.channels_last) and the same"
    columns = [
        Column("Rule", ["layout-transposes"], Kind.NAME, 2),
        Column("Advice", [advice], Kind.PROSE, 0),
        Column("Evidence", ["200 nchwToNhwc/nhwcToNchw kernels per iteration"], Kind.PROSE, 1),
        Column("Gain (ms/iteration)", ["1.841"], Kind.NUMBER, 0),
    ]
    fitted = fit(columns, 80)
    # the rule (secondary) goes, then the evidence; the advice wraps at its spaces, never
    # narrower than its longest word (44 characters)
    assert fitted.dropped == ["Rule", "Evidence"]
    assert [c.header for c in fitted.columns] == ["Advice", "Gain (ms/iteration)"]
    assert fitted.widths[0] >= len("model.to(memory_format=torch.channels_last)")
    assert fitted.width() <= 80
    wide = fit(columns, 200)
    assert wide.dropped == [] and wide.widths[1] == len(advice)


CRASH = """
    import torch

    def step(model, i):
        if i == 2:
            raise ValueError(f"bad batch at step {i}")
        model(torch.randn(2, 4)).sum().backward()

    model = torch.nn.Linear(4, 1)
    for i in range(10):
        step(model, i)
"""


def _run(out: Path, script: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return xsp(
        "run",
        "--levels",
        "M",
        "--iterations",
        "3",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--m-processes",
        "1",
        "--out",
        str(out),
        *more,
        "--",
        "python",
        str(script),
        cwd=script.parent,
    )


def test_a_crashing_script_says_its_error_once_from_its_own_frames(tmp_path: Path) -> None:
    """The error came three or four times, xsp's frames (child.py, runpy) first."""
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH))
    done = _run(tmp_path / "R", script)
    assert done.returncode == 1
    assert done.stderr.count("Traceback (most recent call last):") == 1
    frames = re.findall(r'File "([^"]+)", line (\d+)', done.stderr)
    assert frames == [(str(script), "11"), (str(script), "6")]  # the loop, then the raise
    said = done.stdout + done.stderr
    # the traceback's last line, and xsp's last line naming the level set and the store
    assert said.count("ValueError: bad batch at step 2") == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("xsp: error: level set M: error: ValueError: bad batch at step 2")


def test_a_reused_out_is_refused_unless_replace(tmp_path: Path) -> None:
    """An earlier measurement's level sets stayed beside the new one's, with a warning."""
    out = tmp_path / "R"
    shutil.copytree(R50, out)
    (out / "notes.txt").write_text("mine")
    script = tmp_path / "steps.py"
    script.write_text(textwrap.dedent(CRASH).replace("i == 2", "i == 99"))
    refused = _run(out, script)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"xsp: error: {out} holds an earlier measurement (M, MF, MFLG, manifest.json): pass "
        "--replace to measure into it again (those are removed first), or choose another --out"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "M",
        "MF",
        "MFLG",
        "manifest.json",
        "notes.txt",
    ]
    replaced = _run(out, script, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["M", "manifest.json", "notes.txt"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["levels"] for r in manifest["runs"]] == ["M"]
    assert "another measurement" not in replaced.stdout + replaced.stderr


@pytest.mark.parametrize("columns", [60, 100, 200])
def test_every_width_is_kept(columns: int) -> None:
    done = xsp("analyze", str(R50), columns=columns)
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= columns
