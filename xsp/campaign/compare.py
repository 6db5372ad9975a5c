"""Comparisons across a campaign's jobs, from their result records alone (``DIR/jobs/*.json``):
pure functions that the report renders. A workload is a (model, mode) pair; its jobs are its
batch sizes. Column names carry their units (``latency_ms_b16``)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xsp.campaign.names import family, family_order, labels

__all__ = [
    "BOUNDS",
    "FINDINGS",
    "NAMED",
    "Finding",
    "Record",
    "Workload",
    "batch_sizes",
    "bound_counts",
    "display_names",
    "findings",
    "largest_batch_jobs",
    "ok_jobs",
    "optimal_batches",
    "per_model",
    "tracing_cost",
    "workload_order",
]

Record = dict[str, Any]
Workload = tuple[str, str]  # (model, mode)
BOUNDS = ("launch-bound", "mixed", "compute-bound")
#: How many models a finding names before it says "and N more".
NAMED = 5


def ok_jobs(results: list[Record]) -> list[Record]:
    return [r for r in results if r.get("status") == "ok" and r.get("summary")]


def batch_sizes(results: list[Record]) -> list[int]:
    return sorted({int(r["batch_size"]) for r in results})


def optimal_batches(results: list[Record]) -> dict[Workload, int]:
    """(model, mode) -> the batch size with the highest throughput (XSP's A1 optimal batch)."""
    best: dict[Workload, tuple[float, int]] = {}
    for r in ok_jobs(results):
        throughput = r["summary"].get("throughput_per_s")
        if not throughput:
            continue
        key = (r["model"], r["mode"])
        if key not in best or throughput > best[key][0]:
            best[key] = (throughput, r["batch_size"])
    return {key: batch for key, (_, batch) in best.items()}


def largest_batch_jobs(results: list[Record]) -> dict[Workload, Record]:
    """Each workload's successful job at its largest batch size."""
    largest: dict[Workload, Record] = {}
    for r in ok_jobs(results):
        key = (r["model"], r["mode"])
        if key not in largest or r["batch_size"] > largest[key]["batch_size"]:
            largest[key] = r
    return largest


def workload_order(keys: list[Workload]) -> list[Workload]:
    """Family by family (the report's panel order), then by name."""
    rank = {f: i for i, f in enumerate(family_order())}
    return sorted(set(keys), key=lambda k: (rank.get(family(k[0]), len(rank)), k[0], k[1]))


def display_names(results: list[Record]) -> dict[Workload, str]:
    """Short names for charts and findings; the mode is added only when the campaign has two."""
    models = sorted({r["model"] for r in results})
    short = labels(models)
    modes = {r["mode"] for r in results}
    return {
        (r["model"], r["mode"]): short[r["model"]] + (f" {r['mode']}" if len(modes) > 1 else "")
        for r in results
    }


def per_model(results: list[Record]) -> list[Record]:
    """One row per workload, the batch sizes as columns: ``latency_ms_b<B>``,
    ``throughput_per_s_b<B>``, ``gpu_busy_pct_b<B>``, ``bound_b<B>`` (and where the step and the
    GPU figures come from, ``step_source_b<B>``, ``gpu_timeline_b<B>``) for each batch size B of the
    campaign (None where that job failed or did not run), the optimal batch, and convolution's
    share and the top layer types at the workload's largest successful batch."""
    batches = batch_sizes(results)
    best = optimal_batches(results)
    largest = largest_batch_jobs(results)
    by_key: dict[Workload, dict[int, Record]] = defaultdict(dict)
    for r in results:
        by_key[(r["model"], r["mode"])][int(r["batch_size"])] = r
    rows = []
    for key in workload_order(list(by_key)):
        row: Record = {"model": key[0], "mode": key[1], "family": family(key[0])}
        for b in batches:
            job = by_key[key].get(b) or {}
            s = (job.get("summary") or {}) if job.get("status") == "ok" else {}
            row[f"status_b{b}"] = job.get("status")
            row[f"latency_ms_b{b}"] = s.get("latency_ms")
            row[f"throughput_per_s_b{b}"] = s.get("throughput_per_s")
            row[f"gpu_busy_pct_b{b}"] = s.get("gpu_busy_pct")
            row[f"step_source_b{b}"] = s.get("step_source")  # "traced" where no replay
            row[f"gpu_timeline_b{b}"] = s.get("gpu_timeline")
            row[f"bound_b{b}"] = s.get("bound")
        top = (largest.get(key) or {}).get("summary") or {}
        row["optimal_batch"] = best.get(key)
        row["largest_batch"] = (largest.get(key) or {}).get("batch_size")
        row["conv_share_pct"] = top.get("conv_share_pct")
        row["top_layer_types"] = top.get("top_layer_types") or []
        rows.append(row)
    return rows


def bound_counts(results: list[Record]) -> dict[int, Counter[str]]:
    """batch size -> how many workloads are launch-bound, mixed or compute-bound there."""
    counts: dict[int, Counter[str]] = {b: Counter() for b in batch_sizes(ok_jobs(results))}
    for r in ok_jobs(results):
        if r["summary"].get("bound"):
            counts[int(r["batch_size"])][r["summary"]["bound"]] += 1
    return counts


def tracing_cost(results: list[Record]) -> dict[str, dict[int, float]]:
    """level set -> batch size -> median over jobs of its step time against the shallowest level
    set's (the uninstrumented M run's) step time."""
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in ok_jobs(results):
        steps = r["summary"].get("step_ms") or {}
        if len(steps) < 2:
            continue
        base_name = min(steps, key=len)
        base = steps[base_name]
        for name, step in steps.items():
            if name != base_name and base and step:
                ratios[name][int(r["batch_size"])].append(step / base)
    return {
        name: {b: statistics.median(v) for b, v in sorted(by_batch.items())}
        for name, by_batch in sorted(ratios.items(), key=lambda item: (len(item[0]), item[0]))
    }


def _few(names: list[str]) -> str:
    if len(names) <= NAMED:
        return ", ".join(names)
    return ", ".join(names[:NAMED]) + f" and {len(names) - NAMED} more"


def _pct(value: float) -> str:
    return f"{value:.0f}%"


def _by_batch(values: dict[int, str], unit: str = "") -> str:
    """``{1: '17%', 16: '58%'}`` -> ``17% at batch 1, 58% at 16``."""
    parts = [
        f"{v}{unit} at {'batch ' if i == 0 else ''}{b}" for i, (b, v) in enumerate(values.items())
    ]
    return ", ".join(parts)


Finding = tuple[str, str]  # (lead, sentence)


@dataclass(frozen=True)
class _Campaign:
    """What the findings read: every job's record, the successful ones, the workloads' short
    names, the batch sizes of the successful jobs and how many are bound how at each."""

    results: list[Record]
    ok: list[Record]
    names: dict[Workload, str]
    batches: list[int]
    bounds: dict[int, Counter[str]]

    @classmethod
    def of(cls, results: list[Record]) -> _Campaign:
        ok = ok_jobs(results)
        return cls(results, ok, display_names(results), batch_sizes(ok), bound_counts(results))

    def name(self, r: Record) -> str:
        return self.names[(r["model"], r["mode"])]


def _jobs(c: _Campaign) -> Finding:
    workloads = {(r["model"], r["mode"]) for r in c.results}
    failed = [r for r in c.results if r.get("status") != "ok"]
    outcome = (
        f"{len(c.ok)} of {len(c.results)} jobs ok: {len(workloads)} workloads × batch "
        f"{', '.join(map(str, batch_sizes(c.results)))}."
    )
    if failed:
        reasons = Counter(str(r.get("reason") or r.get("status")) for r in failed)
        outcome += " Failed: " + ", ".join(f"{why} ({n})" for why, n in reasons.most_common())
        outcome += "; " + _few([f"{c.name(r)} b{r['batch_size']}" for r in failed]) + "."
    return ("Jobs", outcome)


def _bounds(c: _Campaign) -> Finding | None:
    if not any(c.bounds.values()):
        return None
    total = {b: sum(n.values()) for b, n in c.bounds.items()}
    return (
        "Launch-bound or compute-bound",
        "launch-bound: "
        + _by_batch({b: f"{n['launch-bound']} of {total[b]}" for b, n in c.bounds.items()})
        + "; compute-bound: "
        + _by_batch({b: str(n["compute-bound"]) for b, n in c.bounds.items()})
        + "; the rest mixed.",
    )


def _gpu_busy(c: _Campaign) -> Finding | None:
    if not any(c.bounds.values()):  # told beside the bounds, as their cause
        return None
    busy = {
        b: [
            r["summary"]["gpu_busy_pct"]
            for r in c.ok
            if r["batch_size"] == b and r["summary"].get("gpu_busy_pct") is not None
        ]
        for b in c.batches
    }
    kernel = {
        b: [
            r["summary"]["median_kernel_us"]
            for r in c.ok
            if r["batch_size"] == b and r["summary"].get("median_kernel_us")
        ]
        for b in c.batches
    }
    return (
        "GPU busy share of the step",
        "median over models "
        + _by_batch({b: _pct(statistics.median(v)) for b, v in busy.items() if v})
        + "; median kernel "
        + _by_batch({b: f"{statistics.median(v):.1f}" for b, v in kernel.items() if v}, " µs")
        + ".",
    )


def _compute_bound_early(c: _Campaign) -> Finding | None:
    first, last = c.batches[0], c.batches[-1]
    early = [
        c.name(r)
        for r in c.ok
        if r["batch_size"] == first and r["summary"].get("bound") == "compute-bound"
    ]
    if not early or first == last:
        return None
    return (f"Compute-bound already at batch {first}", _few(early) + ".")


def _launch_bound_late(c: _Campaign) -> Finding | None:
    first, last = c.batches[0], c.batches[-1]
    stuck = sorted(
        (
            r
            for r in c.ok
            if r["batch_size"] == last and r["summary"].get("bound") == "launch-bound"
        ),
        key=lambda r: r["summary"]["gpu_busy_pct"],
    )
    if not stuck or first == last:
        return None
    return (
        f"Still launch-bound at batch {last}",
        _few([f"{c.name(r)} ({_pct(r['summary']['gpu_busy_pct'])} busy)" for r in stuck])
        + ": kernels too small for the GPU at every batch size.",
    )


def _best_batch(c: _Campaign) -> Finding | None:
    best = optimal_batches(c.results)
    if not best:
        return None
    top_batch, top_n = Counter(best.values()).most_common(1)[0]
    text = f"batch {top_batch} for {top_n} of {len(best)} workloads"
    others = [f"{c.names[k]} (batch {b})" for k, b in sorted(best.items()) if b != top_batch]
    return ("Best throughput", text + ("; " + _few(others) if others else "") + ".")


def _range(c: _Campaign) -> Finding | None:
    first, last = c.batches[0], c.batches[-1]
    at_last = [r for r in c.ok if r["batch_size"] == last and r["summary"].get("throughput_per_s")]
    at_first = [r for r in c.ok if r["batch_size"] == first and r["summary"].get("latency_ms")]
    if not (at_last and at_first):
        return None
    fast = max(at_last, key=lambda r: r["summary"]["throughput_per_s"])
    slow = min(at_last, key=lambda r: r["summary"]["throughput_per_s"])
    quick = min(at_first, key=lambda r: r["summary"]["latency_ms"])
    late = max(at_first, key=lambda r: r["summary"]["latency_ms"])
    return (
        "Range",
        f"at batch {last} from {slow['summary']['throughput_per_s']:,.0f} items/s "
        f"({c.name(slow)}) to {fast['summary']['throughput_per_s']:,.0f} ({c.name(fast)}); "
        f"at batch {first} latency from {quick['summary']['latency_ms']:.2f} ms "
        f"({c.name(quick)}) to {late['summary']['latency_ms']:.2f} ms ({c.name(late)}).",
    )


def _convolution(c: _Campaign) -> Finding | None:
    conv = sorted(
        (
            (k, r["summary"].get("conv_share_pct") or 0.0)
            for k, r in largest_batch_jobs(c.results).items()
        ),
        key=lambda item: -item[1],
    )
    if not conv or conv[0][1] <= 0:
        return None
    none = [c.names[k] for k, share in conv if share < 0.5]
    text = ", ".join(f"{c.names[k]} {_pct(share)}" for k, share in conv[:3])
    if none:
        text += f"; none in {len(none)} ({_few(none)})"
    return ("Convolution's share of layer time (largest batch)", "highest " + text + ".")


def _suggestions(c: _Campaign) -> Finding | None:
    jobs_by_rule: Counter[str] = Counter()
    models_by_rule: dict[str, set[Workload]] = defaultdict(set)
    for r in c.ok:
        for rule in r["summary"].get("suggestions") or []:
            jobs_by_rule[rule] += 1
            models_by_rule[rule].add((r["model"], r["mode"]))
    if not jobs_by_rule:
        return None
    return (
        "Suggestions that fired",
        ", ".join(
            f"{rule} in {n} jobs ({len(models_by_rule[rule])} workloads)"
            for rule, n in jobs_by_rule.most_common()
        )
        + ".",
    )


def _tracing_cost(c: _Campaign) -> Finding | None:
    cost = tracing_cost(c.results)
    if not cost:
        return None
    steps = next(
        r["summary"]["step_ms"] for r in c.ok if len(r["summary"].get("step_ms") or {}) > 1
    )
    shallow = min(steps, key=len)
    return (
        f"Tracing cost, median step time against {shallow}",
        "; ".join(
            f"{name} " + _by_batch({b: f"{v:.2f}" for b, v in by_batch.items()}, "×")
            for name, by_batch in cost.items()
        )
        + ".",
    )


#: The findings told after the jobs' outcome when some job succeeded, in this order; each
#: returns None when the campaign has nothing to say on it.
FINDINGS: tuple[Callable[[_Campaign], Finding | None], ...] = (
    _bounds,
    _gpu_busy,
    _compute_bound_early,
    _launch_bound_late,
    _best_batch,
    _range,
    _convolution,
    _suggestions,
    _tracing_cost,
)


def findings(results: list[Record]) -> list[Finding]:
    """The campaign's headline facts, as (lead, sentence) pairs, worked out from the records:
    job outcomes, launch- against compute-bound by batch size, GPU busy share, the optimal batch,
    the throughput range, convolution's share, the suggestions that fired and tracing's cost."""
    campaign = _Campaign.of(results)
    told = [_jobs(campaign)]
    if not campaign.ok:
        return told
    return told + [f for f in (finding(campaign) for finding in FINDINGS) if f is not None]
