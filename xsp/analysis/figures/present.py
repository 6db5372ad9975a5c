"""How analysis tables read to a person: column names as words with units, numbers as numbers
(counts as integers, sizes in KiB/MiB/GiB), kernel names without their template arguments.
Shared by the terminal tables and the HTML report; ``--json`` keeps the raw columns."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "ANONYMOUS",
    "KERNEL_CHARS",
    "KERNEL_COLUMNS",
    "UNITS",
    "WORDS",
    "byte_scale",
    "cell",
    "cut_kernel",
    "display",
    "distinct_kernels",
    "header",
    "human_bytes",
    "short_kernel",
    "short_label",
]

#: Column-name suffixes that carry a unit, and how a header shows it.
UNITS = {
    "ms": "ms",
    "us": "µs",
    "ns": "ns",
    "s": "s",
    "pct": "%",
    "x": "×",
    "bytes": "bytes",
    "mhz": "MHz",
    "w": "W",
    "j": "J",
    "flop": "FLOP",
    "gflop": "GFLOP",
    "tflop": "TFLOP",
}
#: Words a header writes differently from its column name.
WORDS = {
    "gpu": "GPU",
    "cpu": "CPU",
    "sm": "SM",
    "dram": "DRAM",
    "p50": "p50",
    "p90": "p90",
    "l2": "L2",
    "ci": "CI",
    "mfu": "MFU",
    **{p: p.upper() for p in ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")},
}
KERNEL_CHARS = 60
#: Where a name may be cut, here and in the terminal (``xsp.cli.fit``): where a word begins,
#: after ``::`` or one of ``./ _-``.
WORD_BOUNDARY = re.compile(r"(?<=::)|(?<=[./ _-])(?=.)")
ANONYMOUS = "(anonymous namespace)::"


def header(column: str) -> str:
    """``gain_ms_per_iteration`` -> "Gain (ms/iteration)", ``share_pct`` -> "Share (%)",
    ``calls_per_iteration`` -> "Calls per iteration", ``ms_per_iteration`` -> "Time
    (ms/iteration)"."""
    words = column.split("_")
    per = ""
    if "per" in words[1:]:
        at = len(words) - 1 - words[::-1].index("per")
        per, words = " ".join(words[at + 1 :]), words[:at]
    unit = UNITS[words[-1]] if words[-1] in UNITS and (len(words) > 1 or per) else ""
    if unit:
        words = words[:-1]
    text = " ".join(WORDS.get(w, w) for w in words) or _UNNAMED.get(unit, "Value")
    text = text[:1].upper() + text[1:]
    if unit == "bytes":  # each cell carries its own unit (``human_bytes``): KiB, MiB, GiB
        return f"{text} (per {per})" if per else text
    if not unit:
        return f"{text} per {per}" if per else text
    return f"{text} ({unit}/{per})" if per else f"{text} ({unit})"


#: What a column that is only a unit measures.
_UNNAMED = {"ms": "Time", "us": "Time", "ns": "Time", "s": "Time", "bytes": "Size"}


def byte_scale(largest: float) -> tuple[str, int]:
    """The binary unit an axis of sizes up to ``largest`` reads in, and its size in bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(largest) >= size:
            return unit, size
    return "B", 1


def human_bytes(value: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def _is_size(column: str) -> bool:
    """``dram_read_bytes`` and ``allocated_bytes_per_iteration`` hold sizes."""
    return column.endswith("bytes") or "_bytes_per_" in column


def cell(column: str, value: Any) -> str:
    """One value as text: integers (and whole floats, such as counts per iteration) without
    decimals, sizes in binary units, percentages with one decimal, other floats with three."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and _is_size(column):
        return human_bytes(float(value))
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if column.endswith("_pct"):
            return f"{value:,.1f}"
        return f"{value:,.3f}"
    return str(value)


def short_kernel(name: str, limit: int = KERNEL_CHARS) -> str:
    """A demangled kernel name as a reader scans for it: the ``void`` return type dropped,
    template arguments elided to ``<…>``, the parameter list dropped, then cut to ``limit``
    characters (the last one an ellipsis).

    ``void cutlass::Kernel<cutlass_80_tensorop_s1688gemm<...>>(Params)`` -> ``cutlass::Kernel<…>``.
    Names that arrive already truncated (a job summary keeps 80 characters) may stop inside a
    template; the open template is elided all the same. ``(anonymous namespace)::`` scopes are
    dropped too (they are not a parameter list, and they say nothing to a reader)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    out: list[str] = []
    depth = 0  # inside template arguments
    i = 0
    while i < len(text):
        char = text[i]
        if char == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif char == ">" and depth:
            depth -= 1
        elif depth:
            pass
        elif char == "(":
            if text.startswith(ANONYMOUS, i):  # a scope, not the parameter list: dropped
                i += len(ANONYMOUS)
                continue
            break  # the parameter list
        else:
            out.append(char)
        i += 1
    return cut_kernel("".join(out).strip() or name.strip(), limit)


#: Where a kernel label's distinguishing part starts (``distinct_kernels``): its first template
#: argument list, or a `` #2`` that numbers namesakes.
_KERNEL_TAIL = re.compile(r"<| #\d+$")


def cut_kernel(label: str, limit: int, length: Callable[[str], int] = len) -> str:
    """A kernel's label within ``limit`` (by ``length``: the terminal counts cells), as every
    view cuts it: what tells it from its namesakes (``<…, 128, …>``, `` #2``) kept whole; its
    leading namespaces dropped first (``…vectorized_elementwise_kernel``), then its end cut
    where a word begins (``sm90_xmma_wgrad_implicit_gemm_…``); an ellipsis where each part
    went. A word is never cut: a first word longer than the room is kept whole, and only a
    name of one word is cut at the limit."""
    if length(label) <= limit:
        return label
    found = _KERNEL_TAIL.search(label)
    at = found.start() if found and found.start() else len(label)
    head, tail = label[:at], label[at:]
    room = limit - length(tail)
    lead = ""
    while "::" in head and length(lead + head) > room:
        head, lead = head.split("::", 1)[1], "…"
    if length(lead + head) <= room:
        return lead + head + tail
    keep = max(room - length(lead) - 1, 1)  # the head's characters before its ellipsis
    starts = [m.start() for m in WORD_BOUNDARY.finditer(head) if m.start() > 0]
    within = [start for start in starts if start <= keep]
    if within:
        keep = within[-1]
    elif starts:  # the first word is longer than the room: whole all the same
        keep = starts[0]
    return lead + head[:keep] + "…" + tail


def _template_args(name: str) -> tuple[str, list[str], str] | None:
    """(what comes before the first template's ``<``, its top-level arguments, what follows its
    ``>`` up to the parameter list), or None without a template. A comma inside a nested
    template or parentheses (a lambda's signature) does not split an argument."""
    text = name.strip().removeprefix("void ")
    start = text.find("<")
    paren = text.find("(")
    if start < 0 or 0 <= paren < start:
        return None
    args: list[str] = []
    current: list[str] = []
    depth = 0
    for at in range(start, len(text)):
        char = text[at]
        if char in "<(":
            depth += 1
            if depth == 1:
                continue
        elif char in ">)":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                rest = short_kernel(text[at + 1 :], limit=10_000) if text[at + 1 :] else ""
                return text[:start], args, "" if rest.startswith("(") else rest
        elif char == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    return None


#: A template argument that tells kernels apart is shown whole up to this many characters;
#: longer, only its own name (``CUDAFunctor_add<…>``) or the words where it differs (``…_tn_…``).
ARG_CHARS = 24
#: A C-style cast before an enum's value, ``(cudnnKernelDataType_t)2``: the value tells apart.
_CAST = re.compile(r"^\([\w:]+\)(?=-?\d+$)")


def _own_name(arg: str) -> str:
    """``at::native::CUDAFunctor_add<float>`` -> ``CUDAFunctor_add<…>``."""
    return short_kernel(arg, limit=10_000).rsplit("::", 1)[-1]


def _differing_words(args: list[str]) -> list[str]:
    """Each argument cut to the words where the arguments differ, cut only between words:
    ``cutlass_80_…_32x3_tn_align4`` and ``…_nt_align4`` -> ``…_tn_…`` and ``…_nt_…``."""
    words = [WORD_BOUNDARY.split(a) for a in args]
    fewest = min(len(w) for w in words)
    head = 0
    while head < fewest - 1 and len({w[head] for w in words}) == 1:
        head += 1
    tail = 0
    while tail < fewest - 1 - head and len({w[-1 - tail] for w in words}) == 1:
        tail += 1
    shown = []
    for w in words:
        middle = "".join(w[head : len(w) - tail])
        cut_after = bool(tail)
        if len(middle) > ARG_CHARS:  # still long: its first words up to ARG_CHARS
            kept = ""
            for word in WORD_BOUNDARY.split(middle):
                if kept and len(kept + word) > ARG_CHARS:
                    break
                kept += word
            middle, cut_after = kept, True
        before = "…" + w[head - 1][-1:] if head and w[head - 1][-1:] in "_-./ " else "…"
        shown.append((before if head else "") + middle + ("…" if cut_after else ""))
    return shown


def _told_apart(args: list[str]) -> list[str]:
    """One differing template argument of each member, as short as still tells them apart:
    whole when short, else its own name, else the words where it differs."""
    args = [_CAST.sub("", a) for a in args]
    if all(len(a) <= ARG_CHARS for a in args):
        return args
    own = [_own_name(a) for a in args]
    if len(set(own)) == len(set(args)) and all(len(o) <= ARG_CHARS for o in own):
        return own
    return _differing_words(args)


def _telling_positions(found: list[list[str]]) -> list[int]:
    """The fewest argument positions, first to last, that tell the members apart (each one
    kept only where it tells more apart)."""
    chosen: list[int] = []
    told = 1
    for i in range(len(found[0])):
        more = len({tuple(args[j] for j in [*chosen, i]) for args in found})
        if more > told:
            chosen.append(i)
            told = more
        if told == len(found):
            break
    return chosen


def distinct_kernels(names: list[str], limit: int = KERNEL_CHARS) -> list[str]:
    """``short_kernel`` of each name, except where two different kernels would read alike: those
    keep the template arguments that tell them apart, the others elided
    (``cudnn::bn_bw_1C11_kernel_new<…, 128, …>`` and ``<…, 512, …>``; a long argument by its own
    name or the words where it differs). A kernel named twice reads the same both times;
    kernels told apart by nothing short get ``#1``, ``#2``. Shared by the terminal's tables and
    the HTML report, so both name a kernel alike."""
    short = [short_kernel(n, limit) for n in names]
    groups: dict[str, list[str]] = {}
    for name, label in zip(names, short, strict=True):
        if name not in groups.setdefault(label, []):
            groups[label].append(name)
    chosen: dict[str, str] = {}
    for label, members in groups.items():
        if len(members) > 1:
            chosen.update(_apart(label, members, limit))
    return [chosen.get(n, label) for n, label in zip(names, short, strict=True)]


def _apart(label: str, members: list[str], limit: int) -> dict[str, str]:
    """Each of ``members`` (different kernels that read ``label``) by what tells it apart."""
    numbered = {m: f"{label} #{i}" for i, m in enumerate(members, start=1)}
    parts = [_template_args(m) for m in members]
    found = [p for p in parts if p is not None]
    if len(found) < len(parts) or len({len(p[1]) for p in found}) != 1:
        return numbered
    positions = _telling_positions([p[1] for p in found])
    if not positions:
        return numbered
    columns = {i: _told_apart([p[1][i] for p in found]) for i in positions}
    chosen = {}
    for at, (member, (head, args, rest)) in enumerate(zip(members, found, strict=True)):
        shown: list[str] = []
        for i in range(len(args)):
            if i in columns:
                shown.append(columns[i][at])
            elif not shown or shown[-1] != "…":
                shown.append("…")
        chosen[member] = f"{short_kernel(head, limit)}<{', '.join(shown)}>{rest}"
    return numbered if len(set(chosen.values())) < len(members) else chosen


def short_label(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def display(column: str, value: Any, width: int = 60) -> str:
    """A cell for a person: kernel-name columns shortened, other text cut to ``width``."""
    if isinstance(value, str) and column in KERNEL_COLUMNS:
        return short_kernel(value, width)
    text = cell(column, value)
    return text if len(text) <= width else text[: width - 1] + "…"


#: Columns that hold demangled kernel names.
KERNEL_COLUMNS = frozenset({"kernel", "top_kernel"})
