"""Comparisons across a campaign's jobs, from their result records alone (``DIR/jobs/*.json``):
pure functions that the report renders. A workload is a (model, mode) pair; its jobs are its
batch sizes. Column names carry their units (``latency_ms_b16``)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from xsp.campaign.names import family, family_order, labels

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
    ``throughput_per_s_b<B>``, ``gpu_busy_pct_b<B>``, ``bound_b<B>`` for each batch size B of the
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


def findings(results: list[Record]) -> list[tuple[str, str]]:
    """The campaign's headline facts, as (lead, sentence) pairs, worked out from the records:
    job outcomes, launch- against compute-bound by batch size, GPU busy share, the optimal batch,
    the throughput range, convolution's share, the suggestions that fired and tracing's cost."""
    out: list[tuple[str, str]] = []
    ok = ok_jobs(results)
    names = display_names(results)
    batches = batch_sizes(ok)
    workloads = {(r["model"], r["mode"]) for r in results}
    failed = [r for r in results if r.get("status") != "ok"]
    outcome = (
        f"{len(ok)} of {len(results)} jobs ok: {len(workloads)} workloads × batch "
        f"{', '.join(map(str, batch_sizes(results)))}."
    )
    if failed:
        reasons = Counter(str(r.get("reason") or r.get("status")) for r in failed)
        outcome += " Failed: " + ", ".join(f"{why} ({n})" for why, n in reasons.most_common())
        outcome += (
            "; "
            + _few([f"{names[(r['model'], r['mode'])]} b{r['batch_size']}" for r in failed])
            + "."
        )
    out.append(("Jobs", outcome))
    if not ok:
        return out
    counts = bound_counts(results)
    if any(counts.values()):
        total = {b: sum(c.values()) for b, c in counts.items()}
        out.append(
            (
                "Launch-bound or compute-bound",
                "launch-bound: "
                + _by_batch({b: f"{c['launch-bound']} of {total[b]}" for b, c in counts.items()})
                + "; compute-bound: "
                + _by_batch({b: str(c["compute-bound"]) for b, c in counts.items()})
                + "; the rest mixed.",
            )
        )
        busy = {
            b: [
                r["summary"]["gpu_busy_pct"]
                for r in ok
                if r["batch_size"] == b and r["summary"].get("gpu_busy_pct") is not None
            ]
            for b in batches
        }
        kernel = {
            b: [
                r["summary"]["median_kernel_us"]
                for r in ok
                if r["batch_size"] == b and r["summary"].get("median_kernel_us")
            ]
            for b in batches
        }
        out.append(
            (
                "GPU busy share of the step",
                "median over models "
                + _by_batch({b: _pct(statistics.median(v)) for b, v in busy.items() if v})
                + "; median kernel "
                + _by_batch(
                    {b: f"{statistics.median(v):.1f}" for b, v in kernel.items() if v}, " µs"
                )
                + ".",
            )
        )
        first, last = batches[0], batches[-1]
        early = [
            names[(r["model"], r["mode"])]
            for r in ok
            if r["batch_size"] == first and r["summary"].get("bound") == "compute-bound"
        ]
        if early and first != last:
            out.append((f"Compute-bound already at batch {first}", _few(early) + "."))
        stuck = sorted(
            (
                r
                for r in ok
                if r["batch_size"] == last and r["summary"].get("bound") == "launch-bound"
            ),
            key=lambda r: r["summary"]["gpu_busy_pct"],
        )
        if stuck and first != last:
            out.append(
                (
                    f"Still launch-bound at batch {last}",
                    _few(
                        [
                            f"{names[(r['model'], r['mode'])]} ({_pct(r['summary']['gpu_busy_pct'])} busy)"
                            for r in stuck
                        ]
                    )
                    + ": kernels too small for the GPU at every batch size.",
                )
            )
    best = optimal_batches(results)
    if best:
        at = Counter(best.values())
        top_batch, top_n = at.most_common(1)[0]
        text = f"batch {top_batch} for {top_n} of {len(best)} workloads"
        others = [f"{names[k]} (batch {b})" for k, b in sorted(best.items()) if b != top_batch]
        out.append(("Best throughput", text + ("; " + _few(others) if others else "") + "."))
    last = batches[-1]
    at_last = [r for r in ok if r["batch_size"] == last and r["summary"].get("throughput_per_s")]
    at_first = [r for r in ok if r["batch_size"] == batches[0] and r["summary"].get("latency_ms")]
    if at_last and at_first:
        fast = max(at_last, key=lambda r: r["summary"]["throughput_per_s"])
        slow = min(at_last, key=lambda r: r["summary"]["throughput_per_s"])
        quick = min(at_first, key=lambda r: r["summary"]["latency_ms"])
        late = max(at_first, key=lambda r: r["summary"]["latency_ms"])
        out.append(
            (
                "Range",
                f"at batch {last} from {slow['summary']['throughput_per_s']:,.0f} items/s "
                f"({names[(slow['model'], slow['mode'])]}) to {fast['summary']['throughput_per_s']:,.0f} "
                f"({names[(fast['model'], fast['mode'])]}); at batch {batches[0]} latency from "
                f"{quick['summary']['latency_ms']:.2f} ms ({names[(quick['model'], quick['mode'])]}) to "
                f"{late['summary']['latency_ms']:.2f} ms ({names[(late['model'], late['mode'])]}).",
            )
        )
    largest = largest_batch_jobs(results)
    conv = sorted(
        ((k, r["summary"].get("conv_share_pct") or 0.0) for k, r in largest.items()),
        key=lambda item: -item[1],
    )
    if conv and conv[0][1] > 0:
        none = [names[k] for k, share in conv if share < 0.5]
        text = ", ".join(f"{names[k]} {_pct(share)}" for k, share in conv[:3])
        if none:
            text += f"; none in {len(none)} ({_few(none)})"
        out.append(("Convolution's share of layer time (largest batch)", "highest " + text + "."))
    jobs_by_rule: Counter[str] = Counter()
    models_by_rule: dict[str, set[Workload]] = defaultdict(set)
    for r in ok:
        for rule in r["summary"].get("suggestions") or []:
            jobs_by_rule[rule] += 1
            models_by_rule[rule].add((r["model"], r["mode"]))
    if jobs_by_rule:
        out.append(
            (
                "Suggestions that fired",
                ", ".join(
                    f"{rule} in {n} jobs ({len(models_by_rule[rule])} workloads)"
                    for rule, n in jobs_by_rule.most_common()
                )
                + ".",
            )
        )
    cost = tracing_cost(results)
    if cost:
        steps = next(
            r["summary"]["step_ms"] for r in ok if len(r["summary"].get("step_ms") or {}) > 1
        )
        shallow = min(steps, key=len)
        out.append(
            (
                f"Tracing cost, median step time against {shallow}",
                "; ".join(
                    f"{name} " + _by_batch({b: f"{v:.2f}" for b, v in by_batch.items()}, "×")
                    for name, by_batch in cost.items()
                )
                + ".",
            )
        )
    return out
