"""Time per job and the projected wall time of a campaign on one GPU, from its job records.

    python benchmarks/campaign_time.py CAMPAIGN_DIR [LATER_DIR ...] [--project-overlap]
        [--scale-to FULL_DIR]

Prints the jobs' wall times (mean, median, sum), the measured busy time of each lane (one GPU:
the time some job of it was running) and the lanes' sum: the campaign's time on one GPU, since
lanes share nothing. ``--project-overlap`` projects, from each job's per-phase seconds, the time on one
GPU with level-set and job overlap: a process's start-up and untraced warm-up hide behind the end
(flush, conversion, exit) of the one before, and everything else stays on the critical path. It
is for records of a campaign run without overlap (``XSP_OVERLAP=0``): it does not model a zoo
model's processes warming up side by side, which hides a job's later processes' start-up behind
its first process's whole run (stop 45's half campaign: 311 s projected from its own records,
238 s measured).

Several directories are parts of one sample; a later part's record of a job replaces an earlier
one. ``--scale-to`` projects the whole campaign from a sample: the sample's time over the same
jobs' time in FULL_DIR, a complete earlier run, times FULL_DIR's total. Each ``xsp campaign
run`` pays the fork server's start once (its preload: 10–56 s on the H200, the most on a fresh
machine), in the first jobs' start-up; a sample run in parts pays it in every part, so the
projection counts it once: a level set's start-up of more than ``FORK_SERVER_START_S`` (a level
set's own start-up took 0.3–4 s there) beyond its median is that start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Phases after the measured iterations (older records lump them as convert_and_store).
FINISH = ("stop", "drain", "convert", "store", "exit", "convert_and_store")
#: The campaign process's own time per job (its summary), measured without overlap.
SUMMARY_S = 0.21
#: A start-up this much above its level set's median held the fork server's start.
FORK_SERVER_START_S = 5.0


def load(campaigns: list[Path]) -> list[dict[str, Any]]:
    by_job: dict[str, dict[str, Any]] = {}
    for campaign in campaigns:
        paths = sorted((campaign / "jobs").glob("*.json"))
        if not paths:
            sys.exit(f"{campaign}: no job records under jobs/")
        by_job.update((r["job"], r) for r in (json.loads(p.read_text()) for p in paths))
    return list(by_job.values())


def fork_server_starts(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per job, the fork server's start it paid: start-up seconds beyond its level sets' median,
    where they exceed ``FORK_SERVER_START_S``."""
    start_ups: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for levels, phases in (record.get("seconds_by_level_set") or {}).items():
            start_ups[levels].append(phases.get("start_up", 0.0))
    medians = {levels: statistics.median(values) for levels, values in start_ups.items()}
    return {
        r["job"]: sum(
            excess
            for levels, phases in (r.get("seconds_by_level_set") or {}).items()
            if (excess := phases.get("start_up", 0.0) - medians[levels]) > FORK_SERVER_START_S
        )
        for r in records
    }


def scaled_seconds(records: list[dict[str, Any]], full: list[dict[str, Any]]) -> float:
    """The whole campaign's job time projected from a sample of its jobs, the fork server's
    start counted once."""
    starts = fork_server_starts(records)
    sample = {r["job"]: r.get("wall_s", 0.0) - starts[r["job"]] for r in records}
    before = {r["job"]: r.get("wall_s", 0.0) for r in full}
    shared = [job for job in sample if job in before]
    if not shared:
        sys.exit("the sample and the full campaign share no job")
    ratio = sum(sample[j] for j in shared) / sum(before[j] for j in shared)
    return ratio * sum(before.values()) + max(starts.values())


def lanes(records: list[dict[str, Any]]) -> dict[Any, tuple[float, int]]:
    """Per lane (GPU): the time some job of it was running (the union of the jobs' intervals,
    so that the gaps between the parts of a campaign run in parts do not count), and its jobs."""
    by_gpu: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for record in records:
        start = record["started"]
        by_gpu[record.get("gpu")].append((start, start + record.get("wall_s", 0.0)))
    out = {}
    for gpu, intervals in by_gpu.items():
        busy, end = 0.0, float("-inf")
        for start, stop in sorted(intervals):
            if stop > end:
                busy += stop - max(start, end)
                end = stop
        out[gpu] = (busy, len(intervals))
    return out


def overlapped_seconds(records: list[dict[str, Any]], spec: dict[str, Any]) -> float:
    """One lane in campaign order: each level set's traced iterations and finish are on the
    critical path; its start-up and warm-up only where they outlast the finish before them."""
    by_id = {r["job"]: r for r in records}
    total, previous_finish = 0.0, 0.0
    for record in sorted(by_id.values(), key=lambda r: r["started"]):
        for levels in spec["level_sets"]:
            phases = (record.get("seconds_by_level_set") or {}).get(levels) or {}
            finish = sum(phases.get(k, 0.0) for k in FINISH)
            ahead = phases.get("start_up", 0.0) + phases.get("untraced_warm_up", 0.0)
            switch_on = phases.get("calibration", 0.0) + phases.get("switch_on", 0.0)
            total += switch_on + phases.get("traced_iterations", 0.0) + finish
            total += max(0.0, ahead - previous_finish)
            previous_finish = finish
        total += SUMMARY_S
        previous_finish += SUMMARY_S
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("campaigns", type=Path, nargs="+", metavar="campaign")
    parser.add_argument("--project-overlap", action="store_true")
    parser.add_argument("--scale-to", type=Path, metavar="FULL_DIR")
    args = parser.parse_args()
    records = load(args.campaigns)
    spec = json.loads((args.campaigns[0] / "campaign.json").read_text())
    walls = [r.get("wall_s", 0.0) for r in records]
    ok = sum(r["status"] == "ok" for r in records)
    print(f"{len(records)} jobs ({ok} ok) of {spec['name']!r}")
    print(
        f"job wall s: mean {statistics.mean(walls):.2f}, median {statistics.median(walls):.2f}, "
        f"max {max(walls):.1f}; sum {sum(walls):.0f} s = {sum(walls) / 60:.1f} min"
    )
    measured = lanes(records)
    for gpu, (seconds, count) in sorted(measured.items(), key=lambda kv: str(kv[0])):
        print(f"lane {gpu}: {count} jobs in {seconds:.1f} s ({seconds / count:.2f} s per job)")
    lane_sum = sum(seconds for seconds, _ in measured.values())
    print(f"lanes together (one GPU): {lane_sum:.0f} s = {lane_sum / 60:.1f} min")
    if args.project_overlap:
        projected = overlapped_seconds(records, spec)
        print(f"projected on one GPU with overlap: {projected:.0f} s = {projected / 60:.1f} min")
    if args.scale_to:
        full = load([args.scale_to])
        starts = fork_server_starts(records)
        print(
            f"fork server starts in the sample: {sum(starts.values()):.0f} s "
            f"(largest {max(starts.values()):.0f} s)"
        )
        projected = scaled_seconds(records, full)
        print(
            f"whole campaign projected from {len(records)} of its jobs against "
            f"{args.scale_to} ({len(full)} jobs, {sum(r.get('wall_s', 0.0) for r in full) / 60:.1f} min): "
            f"{projected:.0f} s = {projected / 60:.1f} min on one GPU"
        )


if __name__ == "__main__":
    main()
