"""Compiled kernels to the modules they came from, by inductor's provenance.

``xsp.tracer.capture.inductor`` keeps, per (phase, kernel name), the source modules of each
definition in the order the compiled code calls them. Here each launched kernel (a GPU kernel,
or on CPU the profiler range of a generated C++ kernel) gets, instead of the layer that called
the compiled model, the innermost module holding its nodes. Within one run of a compiled region
the k-th launch of a name takes the k-th definition when the counts agree (inductor reuses a
kernel for identical blocks), else the module holding all its definitions.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from xsp.tracer.convert.columns import arrow

#: On CPU a generated kernel's profiler range is ``graph_<id>_<kernel name>``.
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")


def common_module(paths: Iterable[str]) -> str:
    """The innermost module holding all of ``paths`` (dotted, ``""`` for the root)."""
    parts = [p.split(".") if p else [] for p in paths]
    if not parts:
        return ""
    shared = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        shared.append(names[0])
    return ".".join(shared)


def source_key(phase: str | None, name: str) -> str:
    """The provenance key of a kernel launched in ``phase``."""
    return f"{phase or 'forward'} {_GRAPH_PREFIX.sub('', name)}"


def attribute(
    module_path: pa.Array,
    names: Sequence[str | None],
    phases: Sequence[str | None],
    regions: np.ndarray,
    start_ns: np.ndarray,
    sources: dict[str, list[list[str]]],
) -> pa.DictionaryArray | pa.Array:
    """``module_path`` with each compiled kernel's source module where provenance names one.
    ``regions`` identifies the compiled-region run each row was launched in (its parent)."""
    if not sources or not len(names):
        return module_path
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row, name in enumerate(names):
        if name is None:
            continue
        key = source_key(phases[row], name)
        if key in sources:
            groups[(int(regions[row]), key)].append(row)
    if not groups:
        return module_path
    paths = module_path.cast(pa.string()).to_pylist()
    for (_, key), rows in groups.items():
        definitions = sources[key]
        rows.sort(key=lambda r: int(start_ns[r]))
        if len(rows) == len(definitions):
            chosen = [common_module(d) if d else None for d in definitions]
        else:
            everything = [m for d in definitions for m in d]
            chosen = [common_module(everything) if everything else None] * len(rows)
        for row, path in zip(rows, chosen, strict=True):
            if path:  # the root says nothing the nesting did not
                paths[row] = path
    return arrow(paths, pa.string()).dictionary_encode()
