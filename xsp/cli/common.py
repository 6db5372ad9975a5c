"""What every command shares: the two consoles (stderr for what xsp says, stdout for what a
command prints), one-line errors and warnings, progress bars, the group that turns an
``XspError`` into ``xsp: error: ...``, and opening a stored measurement."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from xsp.core.errors import EXIT_INTERRUPTED, XspError

__all__ = [
    "IN_PROCESS_HELP",
    "XspGroup",
    "bar_per_key",
    "console",
    "fail",
    "labelled_bars",
    "open_store",
    "out_console",
    "plain",
    "printable",
    "say",
    "say_list",
    "store_location",
    "warn",
]


#: ``--in-process`` of ``xsp verify`` and ``xsp campaign verify``.
IN_PROCESS_HELP = (
    "Each round one process timing the zoo workload without and with the fix in alternating "
    "blocks, so that the drift between processes cancels (a fix that changes the process for "
    "good, dataloader, alloc_conf or cudnn_benchmark, still runs in paired processes)."
)


class _Console(Console):
    """A console whose text names a staged object store by its URI, not its scratch copy
    (``xsp.core.store.location.shown``)."""

    def print(self, *objects: Any, **options: Any) -> None:
        super().print(*(_shown(o) if isinstance(o, str) else o for o in objects), **options)


def _shown(text: str) -> str:
    """``text`` with each staged object store named by its URI; where no command staged one the
    module was never imported (it imports pyarrow), and the text is as it was."""
    location = sys.modules.get("xsp.core.store.location")
    return location.shown(text) if location is not None else text


console = _Console(stderr=True)
out_console = _Console()


#: C0 and C1 controls, DEL, and the bidirectional overrides and isolates: a name holding one
#: could move the cursor, clear the screen or reorder what the terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``), so that a span
    name a sender chose reaches the terminal as characters, never as commands."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


def plain(text: str) -> Text:
    """A table cell from data: printable, and never read as Rich markup (``[red]`` stays)."""
    return Text(printable(text))


@contextlib.contextmanager
def stdout_to_stderr(when: bool = True) -> Iterator[None]:
    """Everything written to standard output meanwhile, by this process and by the programs it
    starts (a re-run workload's own prints), goes to standard error: a command whose output is
    one JSON document keeps it whole for ``| jq``."""
    if not when:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``xsp: error: MESSAGE`` and exit with ``code``."""
    message = _shown(message)
    # messages quote what failed (a gloo error's "[/…/pair.cc:561]"): never read as markup
    console.print(
        f"[bold red]xsp: error:[/] {escape(printable(message))}", highlight=False, soft_wrap=True
    )
    sys.exit(code)


def warn(message: str, out: bool = False) -> None:
    """Print ``xsp: warning: MESSAGE``: on standard error, or with ``out`` on standard output
    beside the results it qualifies (a file or ``| less`` keeps it), wrapped at the width."""
    message = _shown(message)
    if not out:
        console.print(
            f"[yellow]xsp: warning:[/] {escape(printable(message))}",
            highlight=False,
            soft_wrap=True,
        )
        return
    prefix = "xsp: warning:"
    for i, line in enumerate(_wrap(f"{prefix} {printable(message)}", "  ")):
        text = Text(line)
        if i == 0:
            text.stylize("yellow", 0, len(prefix))
        out_console.print(text, highlight=False, soft_wrap=True)


def say(text: str, indent: str = "", hang: str = "", style: str = "") -> None:
    """Print a line of results on standard output, wrapped at the terminal's width between
    words (never inside one); ``indent`` starts each line, ``hang`` the lines after the first;
    ``style`` a rich style (a table's title in bold)."""
    for line in _wrap(printable(_shown(text)), indent + hang, indent):
        out_console.print(Text(line, style=style), highlight=False, soft_wrap=True)


def say_list(text: str) -> None:
    """Print a line that lists figures (``start-up 25.0 s (77%), warm-up 2.2 s (7%), ...``),
    wrapped after a comma or semicolon so that no figure is split from its unit; the lines
    after the first indented."""
    width = out_console.width
    lines: list[str] = []
    for phrase in re.split(r"(?<=[,;]) ", printable(_shown(text))):
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        elif lines:
            lines += _wrap(phrase, "  ", "  ")
        else:
            lines += _wrap(phrase, "  ")
    for line in lines:
        out_console.print(line, highlight=False, markup=False, soft_wrap=True)


def _wrap(text: str, hang: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(
        text,
        max(out_console.width, 20),
        initial_indent=indent,
        subsequent_indent=hang,
        break_long_words=False,  # a word longer than the line overflows it, whole
        break_on_hyphens=False,
    ) or [""]


def labelled_bars(label: str) -> Progress:
    """Bars kept on screen when done, each labelled in bold by the task field ``label`` (a
    format such as ``{task.fields[key]}``), then what it does, done of total, time taken."""
    return Progress(
        TextColumn(f"[bold]{label}"),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def bar_per_key() -> Iterator[Callable[[str, str, int, int], None]]:
    """A progress callback ``(key, what, done, total)`` that draws one bar per key (a rule, a
    campaign job), labelled with the key in bold, kept on screen when done."""
    with labelled_bars("{task.fields[key]}") as bar:
        tasks: dict[str, Any] = {}

        def progress(key: str, what: str, done: int, total: int) -> None:
            if key not in tasks:
                tasks[key] = bar.add_task(what, total=total, key=key)
            bar.update(tasks[key], description=what, completed=done, total=total)

        yield progress


class XspGroup(click.Group):
    """The ``xsp`` group: an ``XspError`` from any command prints as one line and exits with its
    ``exit_code`` (2; 75 for a lost cluster), an interrupt exits 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except XspError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)


def _system_allocator() -> None:
    """Arrow buffers from the C library's allocator, unless ARROW_DEFAULT_MEMORY_POOL names
    one. pyarrow's default, mimalloc, backs large buffers with transparent huge pages; where the
    kernel compacts memory for them on request (THP defrag "madvise", a common default) a page
    fault can stall: reading a 1M-span store spent 1.2-3.1 s in the kernel on the dev machine,
    against 0.3 s with malloc, and held 100 MB more."""
    import os

    import pyarrow as pa

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())


def open_store(run_dir: Path, out: bool = False) -> Any:
    """The measurement, its reader's warnings printed (what it left out or guessed): with
    ``out`` on standard output, before the tables they qualify (not before ``--json``)."""
    from xsp.analysis.measurement.store import MeasurementStore

    _system_allocator()
    store = MeasurementStore(run_dir)
    for message in store.warnings:
        warn(message, out=out)
    return store


class _StoreLocation(click.ParamType):
    """A store's place: a local path, or ``s3://bucket/prefix`` staged for the command
    (``xsp.core.store.location``): copied to a scratch directory first (the objects matching
    ``only``, when given; of the prefixes matching ``committed``, those committed whole), and
    with ``writes``, what the command wrote there uploaded when it ends."""

    name = "path"

    def __init__(
        self, writes: bool, only: tuple[str, ...] = (), committed: tuple[str, ...] = ()
    ) -> None:
        self.writes = writes
        self.only = only
        self.committed = committed

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        if isinstance(value, Path) or ctx is None or not str(value).startswith("s3://"):
            return Path(value)  # a local path: pyarrow (location's import) not imported for it
        from xsp.core.store import location

        stage = location.staged_write if self.writes else location.staged_read
        return ctx.with_resource(stage(value, self.only, self.committed))


def store_location(
    writes: bool = False, only: tuple[str, ...] = (), committed: tuple[str, ...] = ()
) -> click.ParamType:
    """The parameter type of a store's place (a measurement, a campaign); ``writes``: the
    command writes into it; ``only``: the object-store patterns it needs (default all);
    ``committed``: the patterns of prefixes published whole (a campaign's ``runs/*``)."""
    return _StoreLocation(writes, only, committed)
