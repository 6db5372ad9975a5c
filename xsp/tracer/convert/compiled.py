"""Compiled kernels to the modules they came from, by inductor's provenance.

``xsp.tracer.capture.hooks.inductor`` keeps, per (phase, kernel name), the source modules of each
definition in the order the compiled code calls them. Here each launched kernel (a GPU kernel,
or on CPU the profiler range of a generated C++ kernel) gets, instead of the layer that called
the compiled model, the innermost module holding its nodes. Within one run of a compiled region
the k-th launch of a name takes the k-th definition when the counts agree (inductor reuses a
kernel for identical blocks), else the module holding all its definitions.

Library work (cuBLAS, cuDNN, oneDNN) runs as the aten ops the compiled code calls (``aten::mm``,
``aten::convolution``). Each run of a compiled region (AOTAutograd's ``CompiledFunction`` or
``CompiledFunctionBackward``, else dynamo's ``Torch-Compiled Region``) calls one graph's extern
kernels in order. The graph is the one of that phase compiled for the frame the run is in (the
``Torch-Compiled Region: <compile id>`` around a forward run, its forward's for a backward run),
else any of that phase; its ops take the modules of the graph whose calls have the same op names
in the same order, else, per op name, the k-th call's when the counts agree, else the module
holding them all. What ran inside such an op (its own aten calls, and through them its library
calls, API calls and GPU kernels) follows it to that module.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from xsp.core.columns import arrow, dictionary_column
from xsp.core.intervals import depths
from xsp.core.records import ExternGraph

__all__ = [
    "FRAME_PREFIX",
    "REGION_PREFIXES",
    "attribute",
    "attribute_calls",
    "common_module",
    "match_calls",
    "pass_down",
    "source_key",
]

#: On CPU a generated kernel's profiler range is ``graph_<id>_<kernel name>``.
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")

#: The ranges one run of a compiled graph's wrapper code runs in: AOTAutograd's autograd
#: function (forward and ``CompiledFunctionBackward``), else (no autograd) dynamo's frame; and
#: inductor's own, which it opens only while torch's profiler is on.
REGION_PREFIXES = ("CompiledFunction", "Torch-Compiled Region", "## Call CompiledFxGraph")

#: Dynamo's range around each run of a compiled frame, named with the frame's compile id.
FRAME_PREFIX = "Torch-Compiled Region: "


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


def attribute_calls(
    module_path: pa.Array,
    names: Sequence[str | None],
    phases: Sequence[str | None],
    parent: np.ndarray,
    in_region: np.ndarray,
    compile_ids: Sequence[str | None],
    start_ns: np.ndarray,
    graphs: list[ExternGraph],
) -> pa.Array:
    """``module_path`` with each extern op of a compiled region's run (``in_region``: the row's
    parent is such a run) given its source module by the compiled graphs' calls;
    ``compile_ids`` names the compiled frame each row ran in, where known."""
    recorded = {(graph.phase, op) for graph in graphs for op, _ in graph.calls}
    runs: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row in np.nonzero(in_region)[0].tolist():
        phase = phases[row] or "forward"
        if (phase, names[row]) in recorded:
            runs[(int(parent[row]), phase)].append(row)
    if not runs:
        return module_path
    paths = module_path.cast(pa.string()).to_pylist()
    for (_, phase), rows in runs.items():
        rows.sort(key=lambda r: int(start_ns[r]))
        mine = [g for g in graphs if g.phase == phase and g.compile_id == compile_ids[rows[0]]]
        candidates = mine or [g for g in graphs if g.phase == phase]
        for row, modules in zip(
            rows, match_calls([names[r] for r in rows], candidates), strict=True
        ):
            path = common_module(modules) if modules else None
            if path:  # the root says nothing the nesting did not
                paths[row] = path
    return arrow(paths, pa.string()).dictionary_encode()


def match_calls(ops: list[str | None], graphs: list[ExternGraph]) -> list[list[str]]:
    """The source modules of each extern op of one region run (``ops``, in call order: a
    region's ops, or a captured graph's calls, ``graphs.extern_modules``): by
    position in the ``graphs`` that call the same ops in the same order, else by op name as
    generated kernels are matched (the k-th when the counts agree, else all)."""
    same = [g.calls for g in graphs if [op for op, _ in g.calls] == ops]
    if same:
        return [[m for calls in same for m in calls[i][1]] for i in range(len(ops))]
    by_name: dict[str | None, list[list[str]]] = defaultdict(list)
    for graph in graphs:
        for name, modules in graph.calls:
            by_name[name].append(modules)
    counts, taken = Counter(ops), Counter[str | None]()
    out = []
    for called in ops:
        recorded = by_name[called]
        if len(recorded) == counts[called]:
            out.append(recorded[taken[called]])
            taken[called] += 1
        else:
            out.append([m for modules in recorded for m in modules])
    return out


def pass_down(before: pa.Array, after: pa.Array, parent: np.ndarray) -> pa.Array:
    """``after`` with every row that had inherited its parent's module in ``before`` given
    its parent's module in ``after``, top-down: what ran inside a re-attributed op follows it."""
    both = pa.concat_arrays([before.cast(pa.string()), after.cast(pa.string())])
    encoded = both.dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(parent)
    old, new = codes[:n], codes[n:].copy()
    if (old == new).all():
        return after
    depth = depths(parent)
    for level in range(1, int(depth.max(initial=0)) + 1):
        rows = np.nonzero((depth == level) & (old == new))[0]
        up = parent[rows]
        follows = (new[up] != old[up]) & (old[rows] == old[up])
        new[rows[follows]] = new[up[follows]]
    return dictionary_column(new, encoded.dictionary.to_pylist())
