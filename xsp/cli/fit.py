"""Tables that fit the terminal's width: every table the commands print goes through ``fit``.

Each column says what it holds (``Kind``) and how soon it may be left out (``priority``). A table
wider than the terminal is squeezed in this order until it fits, each step only as far as needed:

1. headers wrap at their spaces onto two lines (never inside a word);
2. ``iteration`` in headers becomes ``iter``;
3. names are shortened by what the table is too wide, to ``SOFT_NAME`` characters at most (a
   program line to ``SOFT_PATH``): a path from the left at a ``/`` (its file, line and function
   kept), a kernel as the HTML report cuts it (``cut_kernel``: its namespaces from the left,
   then its end where a word begins), another name from the right after a ``.``, ``_``, ``/``,
   ``-`` or space, an ellipsis where the part went (a kernel keeps its template arguments,
   ``<…, 128, …>``, and a `` #2`` whole: they tell namesakes apart);
4. secondary columns (``priority`` 2 or more: spreads, counts beside a time) are left out, the
   highest priority first (the rightmost first among equals);
5. prose (advice, a verdict) wraps at its spaces, down to its longest word;
6. the other columns but those of priority 0 are left out the same way;
7. names are shortened to their shortest form (one segment and the ellipsis).

Room left over then goes back to the names and the prose. The caller says which columns
were left out (``Fitted.dropped``).

No cell is ever cut inside a word, and a number is never cut.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from enum import Enum

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from xsp.analysis.figures.present import WORD_BOUNDARY, cut_kernel

__all__ = ["Column", "Fitted", "Kind", "fit", "shorten", "table_width"]

#: Names are shortened to this many characters before any column is left out.
SOFT_NAME = 28
#: A path keeps at least its file, line and function before columns are left out.
SOFT_PATH = 40
#: Columns of this priority or higher are left out before prose wraps (step 4).
SECONDARY = 2
#: A header word that shortens when a table is still too wide (step 2): ``(ms/iteration)``.
_ITERATION = re.compile(r"(?<![a-z])iteration(?![a-z])")


class Kind(Enum):
    """What a column holds, which says how its cells may narrow."""

    NUMBER = "number"  # right-aligned, never cut
    NAME = "name"  # shortened from the right at a boundary
    KERNEL = "kernel"  # namespaces from the left, then the end (``cut_kernel``)
    PATH = "path"  # ``dir/file.py:LINE function``, shortened from the left at a ``/``
    PROSE = "prose"  # wraps at spaces, never cut


@dataclass(frozen=True)
class Column:
    """One column as text: ``priority`` 0 is never left out; higher numbers go first."""

    header: str
    cells: list[str]
    kind: Kind = Kind.NAME
    priority: int = 1


@dataclass
class Fitted:
    """The columns that fit, each with its width and header, and the headers left out."""

    columns: list[Column]
    widths: list[int]
    headers: list[str]
    dropped: list[str] = field(default_factory=list)

    def width(self) -> int:
        return table_width(self.widths)

    def table(self) -> Table:
        """The rich table: each cell already as wide as its column at most (names shortened),
        or prose that wraps at its spaces."""
        view = Table()
        for column, width, header in zip(self.columns, self.widths, self.headers, strict=True):
            view.add_column(
                header,
                justify="right" if column.kind is Kind.NUMBER else "left",
                width=width,
                overflow="fold",  # reached only by prose, whose words all fit
            )
        rows = len(self.columns[0].cells) if self.columns else 0
        for i in range(rows):
            view.add_row(
                *(
                    Text(shorten(c.cells[i], w, c.kind))
                    for c, w in zip(self.columns, self.widths, strict=True)
                )
            )
        return view


def table_width(widths: list[int]) -> int:
    """A rich table's width with its default box: each column padded by one space a side, a
    rule between columns and one at each edge."""
    return sum(widths) + 3 * len(widths) + 1


def fit(columns: list[Column], width: int) -> Fitted:
    """The columns laid out within ``width`` characters (steps 1-7 of the module's note), or
    as narrow as they go where even that is too wide (a number is never cut)."""
    fitted = Fitted(list(columns), [_natural(c) for c in columns], [c.header for c in columns], [])
    steps = (
        _wrap_headers,
        _short_headers,
        _soft_names,
        _drop_secondary,
        _wrap_prose,
        _drop,
        _hard_names,
    )
    for step in steps:
        if fitted.width() <= width:
            break
        step(fitted, width)
    _give_back(fitted, width)
    return fitted


def shorten(text: str, width: int, kind: Kind) -> str:
    """``text`` within ``width`` characters where its kind allows, cut only at a boundary (a
    name longer than its shortest form keeps that form)."""
    if cell_len(text) <= width or kind in (Kind.NUMBER, Kind.PROSE):
        return text
    if kind is Kind.PATH:
        return _shorten_path(text, width)
    if kind is Kind.KERNEL:
        return cut_kernel(text, width, cell_len)
    parts = WORD_BOUNDARY.split(text)
    kept = parts[0]
    for part in parts[1:]:
        if cell_len(kept + part) + 1 > width:
            break
        kept += part
    return kept + "…"


def _shorten_path(text: str, width: int) -> str:
    """``/a/b/models/resnet.py:93 forward`` -> ``…/models/resnet.py:93 forward``; without room
    for the function, ``…/resnet.py:93``."""
    where, space, function = text.partition(" ")
    *folders, file = where.split("/")
    kept = file + space + function
    while folders and cell_len(f"…/{folders[-1]}/{kept}") <= width:
        kept = f"{folders.pop()}/{kept}"
    short = f"…/{kept}" if folders else kept
    if cell_len(short) > width and function:
        return _shorten_path(where, width)
    return short


def _natural(column: Column) -> int:
    return max([cell_len(column.header), *(cell_len(c) for c in column.cells)])


def _shortest(column: Column) -> int:
    """The narrowest a column's cells can be: a name's first (kernel: last) segment and the
    ellipsis, a path's file and line, prose's longest word; a number as it is."""
    if column.kind is Kind.NUMBER:
        return max((cell_len(c) for c in column.cells), default=1)
    if column.kind is Kind.PROSE:
        return max((cell_len(w) for c in column.cells for w in c.split()), default=1)
    return max((cell_len(shorten(c, 1, column.kind)) for c in column.cells), default=1)


def _header_floor(header: str) -> int:
    """The narrowest width that keeps ``header`` within two lines, words whole."""
    words = header.split()
    narrowest = max((cell_len(w) for w in words), default=1)
    for width in range(narrowest, cell_len(header) + 1):
        if len(textwrap.wrap(header, width, break_long_words=False)) <= 2:
            return width
    return cell_len(header)


def _set(fitted: Fitted, index: int, width: int) -> None:
    fitted.widths[index] = max(width, _header_floor(fitted.headers[index]))


def _wrap_headers(fitted: Fitted, width: int) -> None:
    for i, column in enumerate(fitted.columns):
        cells = max((cell_len(c) for c in column.cells), default=1)
        _set(fitted, i, min(fitted.widths[i], cells))


def _soft_names(fitted: Fitted, width: int) -> None:
    """Names shorten, the widest first, by what the table is too wide, each to its soft
    width at most."""
    soft = {Kind.NAME: SOFT_NAME, Kind.KERNEL: SOFT_NAME, Kind.PATH: SOFT_PATH}
    names = [i for i, c in enumerate(fitted.columns) if c.kind in soft]
    for i in sorted(names, key=lambda j: -fitted.widths[j]):
        excess = fitted.width() - width
        if excess <= 0:
            return
        column = fitted.columns[i]
        target = max(soft[column.kind], _shortest(column), fitted.widths[i] - excess)
        _set(fitted, i, min(fitted.widths[i], _used(column, target)))


def _used(column: Column, width: int) -> int:
    """How wide a name column's cells are once shortened to ``width``."""
    return max((cell_len(shorten(c, width, column.kind)) for c in column.cells), default=1)


def _short_headers(fitted: Fitted, width: int) -> None:
    for i, header in enumerate(fitted.headers):
        fitted.headers[i] = _ITERATION.sub("iter", header)
        cells = max((cell_len(c) for c in fitted.columns[i].cells), default=1)
        if fitted.columns[i].kind is Kind.NUMBER:
            _set(fitted, i, cells)
        else:
            _set(fitted, i, min(fitted.widths[i], max(cells, 1)))


def _wrap_prose(fitted: Fitted, width: int) -> None:
    """Prose narrows, the widest first, until the table fits or each is at its longest word."""
    prose = [i for i, c in enumerate(fitted.columns) if c.kind is Kind.PROSE]
    for i in sorted(prose, key=lambda j: -fitted.widths[j]):
        excess = fitted.width() - width
        if excess <= 0:
            return
        floor = _shortest(fitted.columns[i])
        _set(fitted, i, max(floor, fitted.widths[i] - excess))


def _drop_secondary(fitted: Fitted, width: int) -> None:
    _drop(fitted, width, lowest=SECONDARY)


def _drop(fitted: Fitted, width: int, lowest: int = 1) -> None:
    """Leave out columns of priority ``lowest`` or more, the highest first (the rightmost
    first among equals), until the table fits."""
    order = sorted(
        (i for i, c in enumerate(fitted.columns) if c.priority >= lowest),
        key=lambda i: (-fitted.columns[i].priority, -i),
    )
    gone: set[int] = set()
    for i in order:
        if table_width([w for j, w in enumerate(fitted.widths) if j not in gone]) <= width:
            break
        gone.add(i)
    fitted.dropped += [fitted.headers[i] for i in sorted(gone)]
    keep = [i for i in range(len(fitted.columns)) if i not in gone]
    fitted.columns = [fitted.columns[i] for i in keep]
    fitted.widths = [fitted.widths[i] for i in keep]
    fitted.headers = [fitted.headers[i] for i in keep]


def _give_back(fitted: Fitted, width: int) -> None:
    """Give names and prose back the room that a left-out column freed (whole names, fewer
    lines a row), the narrowest first."""
    for i in sorted(range(len(fitted.columns)), key=lambda j: fitted.widths[j]):
        column = fitted.columns[i]
        room = width - fitted.width()
        if column.kind is Kind.NUMBER or room <= 0:
            continue
        want = min(_natural(column), fitted.widths[i] + room)
        if column.kind is not Kind.PROSE:
            want = _used(column, want)
        fitted.widths[i] = max(fitted.widths[i], want)


def _hard_names(fitted: Fitted, width: int) -> None:
    names = [i for i, c in enumerate(fitted.columns) if c.kind in (Kind.NAME, Kind.KERNEL)]
    for i in names:
        excess = fitted.width() - width
        if excess <= 0:
            return
        column = fitted.columns[i]
        target = max(_shortest(column), fitted.widths[i] - excess)
        _set(fitted, i, _used(column, target))
