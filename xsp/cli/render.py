"""Terminal renderers shared by the commands: an analysis' table (one block per row where the
table is too wide), and the replay's line with its checks and warnings (their lines
built by ``xsp.analysis.replay.lines``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from xsp.cli.common import console, out_console, plain, warn

if TYPE_CHECKING:
    from xsp.analysis.replay.result import ReplayResult

__all__ = ["print_replay", "print_table", "replay_summary", "replay_warnings"]


def _fits(view: Any, ellipses: int) -> bool:
    """True when ``view`` renders at the terminal's width with no cell cut short and no line
    cropped (rich would otherwise cut cells with "…" or crop the table's right side)."""
    import io

    from rich.console import Console

    probe = Console(file=io.StringIO(), width=out_console.width, color_system=None)
    probe.print(view)
    rendered = probe.file.getvalue()  # type: ignore[attr-defined]
    # a cropped table loses its right border: its top edge no longer ends in a corner
    top = next((line for line in rendered.splitlines() if line.startswith("┏")), "┓")
    return top.endswith("┓") and rendered.count("…") <= ellipses


def print_table(title: str, table: Any, rows: int, note: str = "", lead: str = "") -> None:
    """A table that reads at 80 columns: headers as words with units, numbers whole and never
    wrapped, long names cut (kernel names lose their template arguments; --json and the HTML
    report keep them whole). A table too wide for the terminal prints one block per row.
    ``lead`` is a line printed under the title, before the table (a chart in characters)."""
    from xsp.analysis.figures.present import display, header

    records = table.slice(0, rows).to_pylist()
    cells = [{name: display(name, value, 48) for name, value in r.items()} for r in records]
    if lead:
        out_console.print(f"[bold]{title}[/]", highlight=False)
        out_console.print(lead, highlight=False)
    view = Table(title=None if lead else title, title_justify="left", caption_justify="left")
    for name in table.column_names:
        numeric = any(isinstance(r[name], (int, float)) for r in records)
        longest = max((len(c[name]) for c in cells), default=1)
        # numbers never wrap; text narrower than 14 columns wraps into too many lines to read
        width = longest if numeric else min(longest, 14)
        view.add_column(
            header(name),
            justify="right" if numeric else "left",
            min_width=width,
            overflow="ellipsis" if numeric else "fold",  # a long name wraps, whole
        )
    for row in cells:
        view.add_row(*(plain(text) for text in row.values()))
    captions = []
    if table.num_rows > rows:
        captions.append(f"{rows} of {table.num_rows} rows shown (--rows N for more)")
    if note:
        captions.append(note)
    caption = "; ".join(captions)
    if _fits(view, sum(c.count("…") for row in cells for c in row.values())):
        view.caption = caption or None
        out_console.print(view)
        return
    if not lead:
        out_console.print(f"[bold]{title}[/]", highlight=False)
    for index, record in enumerate(records, start=1):
        row = {name: display(name, value, 200) for name, value in record.items()}
        block = Table(show_header=False, box=None, padding=(0, 1), title=f"{index}.")
        block.title_justify = "left"
        block.add_column(style="dim")
        block.add_column()
        for name, text in row.items():
            block.add_row(header(name), plain(text))
        out_console.print(block)
    if caption:
        out_console.print(caption, highlight=False)


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
    console.print(
        f"replayed step {found.step_ms:.3f} ms{against}"
        + (f"; iterations {unsteady} not steady, left out" if unsteady else ""),
        highlight=False,
    )
    from xsp.analysis.replay.lines import check_lines

    for line in check_lines(found):
        console.print(f"  {line}", highlight=False)
    calib = found.calibration
    if calib.scale is not None and calib.op_ns:
        checks = calib.source.split("; ", 1)[-1]
        console.print(
            f"F's cost taken off the host's times: {calib.op_ns / 1e3:.2f} µs "
            f"an op record, {calib.scale:g}x the probe's ({checks})",
            highlight=False,
        )
    waits = found.median_collective_wait_ms
    if waits:
        each = ", ".join(f"rank {rank} {ms:.3f} ms" for rank, ms in waits.items())
        console.print(
            f"collectives replayed across ranks; each rank's wait for the last to arrive, median "
            f"a step: {each}",
            highlight=False,
        )
    for line in replay_warnings(found):
        warn(line)


def replay_warnings(found: ReplayResult) -> list[str]:
    """Why the replayed step may be off (``xsp.analysis.replay.lines.replay_warnings``)."""
    from xsp.analysis.replay import lines

    return lines.replay_warnings(found)
