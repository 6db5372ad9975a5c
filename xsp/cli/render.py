"""Terminal renderers shared by the commands: an analysis' table fitted to the terminal's
width (``xsp.cli.fit``: columns left out or names shortened, never a row per block), and the
replay's line with its checks and warnings (their lines built by
``xsp.analysis.replay.lines``), all on standard output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xsp.cli.common import out_console, printable, say, warn
from xsp.cli.fit import Column, Kind, fit

if TYPE_CHECKING:
    from xsp.analysis.replay.result import ReplayResult

__all__ = [
    "NAMESAKES",
    "column_kind",
    "kernel_labels",
    "print_replay",
    "print_table",
    "replay_summary",
    "replay_warnings",
]

#: How soon a column is left out of a table too wide for the terminal (``xsp.cli.fit``):
#: 0 never, higher sooner. Unlisted: 0 for a table's first column (what its rows are), then
#: by ``_SPREADS`` or its type (``_priority``).
PRIORITY = {
    "advice": 0,
    "gain_ms_per_iteration": 0,
    "verdict": 0,
    "call": 0,  # a library call's name
    "op": 0,
    "evidence": 1,
    "rule": 2,
    "estimate": 3,
    "calls": 2,  # a diff's "11 -> 0"
    "change_pct": 2,  # a diff's: before, after and the change in ms say it
    "share_pct": 0,
    # counts beside a time: the time says what costs
    "calls_per_iteration": 2,
    "ops_per_iteration": 2,
    "kernels_per_iteration": 2,
}
#: Parts of a column's name that mark a spread or a secondary figure: left out first.
_SPREADS = ("min_", "max_", "_min", "_max", "p50", "p90", "stderr", "trimmed", "ci_", "levels")


def column_kind(name: str, values: list[Any]) -> Kind:
    """A column's kind from its name and values: numbers, kernel names, program lines, prose
    (text with spaces beyond a label's first column), other names."""
    from xsp.analysis.figures.present import KERNEL_COLUMNS

    if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return Kind.NUMBER
    if name in KERNEL_COLUMNS:
        return Kind.KERNEL
    if name == "source":
        return Kind.PATH
    if any(isinstance(v, str) and " " in v.strip() for v in values):
        return Kind.PROSE
    return Kind.NAME


def _priority(name: str, index: int, kind: Kind) -> int:
    if name in PRIORITY:
        return PRIORITY[name]
    if index == 0:
        return 0
    if name.startswith(("before_", "after_", "change_")) and not name.endswith("_pct"):
        return 0  # a diff's figures
    if any(part in name for part in _SPREADS):
        return 3
    return 1 if kind is Kind.NUMBER else 2


def print_table(title: str, table: Any, rows: int, note: str = "", lead: str = "") -> None:
    """A table that fits the terminal: headers as words with units, numbers whole, names
    shortened at a boundary (kernel names without their template arguments; --json and the
    HTML report keep them whole), columns left out where it is too narrow (the caption names
    them). A table of one row too wide for its columns prints as two columns, name and value.
    ``lead`` is a line printed under the title, before the table (a chart in characters)."""
    from xsp.analysis.figures.present import display, header

    records = table.slice(0, rows).to_pylist()
    columns = []
    told_apart: set[str] = set()  # headers of the kernel columns with namesakes told apart
    for index, name in enumerate(table.column_names):
        values = [r[name] for r in records]
        kind = column_kind(name, values)
        cells = [printable(display(name, v, 1000)) for v in values]
        if kind is Kind.KERNEL:
            labels = [printable(label) for label in kernel_labels(table.column(name).to_pylist())]
            if labels[: len(records)] != cells:
                told_apart.add(header(name))
            cells = labels[: len(records)]
        columns.append(Column(header(name), cells, kind, _priority(name, index, kind)))
    width = out_console.width
    fitted = fit(columns, width)
    if title:
        say(title, style="bold")
    if lead:
        out_console.print(lead, highlight=False, markup=False, soft_wrap=True)
    if len(records) == 1 and fitted.dropped:  # one row: every figure, one a line
        pairs = [
            Column("", [c.header for c in columns], Kind.NAME, 0),
            Column("", [c.cells[0] for c in columns], Kind.PROSE, 0),
        ]
        view = fit(pairs, width).table()
        view.show_header = False
    else:
        view = fitted.table()
    out_console.print(view)
    captions = []
    if table.num_rows > rows:
        captions.append(f"{rows} of {table.num_rows} rows shown (--rows N for more)")
    if fitted.dropped and len(records) != 1:
        captions.append(f"left out to fit {width} columns: {', '.join(fitted.dropped)}")
    shown = told_apart if len(records) == 1 else told_apart & set(fitted.headers)
    if shown:  # a kernel column left out needs no key
        captions.append(NAMESAKES)
    if note:
        captions.append(note)
    if captions:
        say("; ".join(captions))


#: The caption under a table whose kernels of one name are told apart.
NAMESAKES = "<…, 128, …>, #2: what tells kernels of one name apart (--json: whole names)"


def kernel_labels(values: list[Any]) -> list[str]:
    """Kernel names as the terminal and the HTML report show them: template arguments elided,
    except those that tell two different kernels of one name apart (``distinct_kernels`` over
    the whole column, so a kernel reads alike however many rows are shown)."""
    from xsp.analysis.figures.present import distinct_kernels

    return distinct_kernels([str(v or "") for v in values], limit=1000)


def replay_summary(store: Any) -> ReplayResult:
    """The replay's check against M (``reconstruction.replay``)."""
    from xsp.analysis.replay import replay

    return replay(store).result()


def print_replay(store: Any) -> None:
    """The replayed step against M's, its two checks (the F process's held-out untraced steps,
    M's interval across processes), then F's cost taken off where a check changed it, the
    ranks' waits for each other, and what could not be checked or did not hold."""
    found = replay_summary(store)
    if found.step_ms is None:
        return
    against = (
        f" against M's {found.measured_step_ms:.3f} ms ({found.error_pct:+.1f}%)"
        if found.measured_step_ms
        else ""
    )
    unsteady = found.unsteady_iterations
    say(
        f"replayed step {found.step_ms:.3f} ms{against}"
        + (f"; iterations {unsteady} not steady, left out" if unsteady else ""),
        hang="  ",
    )
    from xsp.analysis.replay.lines import check_lines

    for line in check_lines(found):
        say(line, indent="  ", hang="  ")
    calib = found.calibration
    if calib.scale is not None and calib.op_ns:
        checks = calib.source.split("; ", 1)[-1]
        say(
            f"F's cost taken off the host's times: {calib.op_ns / 1e3:.2f} µs "
            f"an op record, {calib.scale:g}x the probe's ({checks})",
            hang="  ",
        )
    waits = found.median_collective_wait_ms
    if waits:
        each = ", ".join(f"rank {rank} {ms:.3f} ms" for rank, ms in waits.items())
        say(
            f"collectives replayed across ranks; each rank's wait for the last to arrive, median "
            f"a step: {each}",
            hang="  ",
        )
    for line in replay_warnings(found):
        warn(line, out=True)


def replay_warnings(found: ReplayResult) -> list[str]:
    """Why the replayed step may be off (``xsp.analysis.replay.lines.replay_warnings``)."""
    from xsp.analysis.replay import lines

    return lines.replay_warnings(found)
