"""The gain of a change measured in paired rounds: each round runs the workload as it was (base)
and changed (fixed), each in a fresh process, so that the host's drift between rounds falls on
both sides of a pair.

The statistic is the mean over rounds of each round's difference of mean step times (base less
fixed): a positive gain is time taken off the step. The mean, not the median, because the mean
step is the throughput (the run's time over its iterations), and a changed input pipeline
delivers batches in bursts: with N DataLoader workers, N steps in a row find their batch ready
and the next one waits for it, so the steps are bimodal and their median can be either mode.

Its confidence interval is a two-level bootstrap with a fixed seed: resample the rounds, then
each chosen round's iterations on each side, so the interval holds both the drift between
rounds and the noise within a run. With one round it holds the noise within a run only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 10_000
CONFIDENCE = 0.95
SEED = 0


@dataclass(frozen=True)
class PairedGain:
    """``gain_ms`` per iteration (base less fixed), its ``ci_ms`` (low, high), ``gain_pct`` of
    the base step, the mean steps of each side over the rounds, and the rounds counted."""

    gain_ms: float
    ci_ms: tuple[float, float]
    gain_pct: float | None
    base_ms: float
    fixed_ms: float
    rounds: int


def paired_gain(
    base: Sequence[Sequence[float]],
    fixed: Sequence[Sequence[float]],
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> PairedGain:
    """The gain of ``fixed`` over ``base``: one sequence of step times (ms) per round on each
    side, rounds paired by index. ValueError when a round has no steps or the sides differ in
    rounds."""
    if len(base) != len(fixed) or not base:
        raise ValueError(f"{len(base)} base rounds against {len(fixed)} fixed: pair each round")
    pairs = zip(base, fixed, strict=True)
    sides = [(np.asarray(b, dtype=float), np.asarray(f, dtype=float)) for b, f in pairs]
    if any(not len(b) or not len(f) for b, f in sides):
        raise ValueError("a round without steps on one side")
    base_means = np.array([b.mean() for b, _ in sides])
    fixed_means = np.array([f.mean() for _, f in sides])
    gain = float(np.mean(base_means - fixed_means))
    rng = np.random.default_rng(seed)
    rounds = len(sides)
    differences = np.empty((samples, rounds))
    for index, (b, f) in enumerate(sides):
        resampled_base = b[rng.integers(0, len(b), (samples, len(b)))].mean(axis=1)
        resampled_fixed = f[rng.integers(0, len(f), (samples, len(f)))].mean(axis=1)
        differences[:, index] = resampled_base - resampled_fixed
    chosen = rng.integers(0, rounds, (samples, rounds))
    statistic = np.take_along_axis(differences, chosen, axis=1).mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(statistic, [tail, 1.0 - tail])
    base_ms = float(base_means.mean())
    return PairedGain(
        gain_ms=gain,
        ci_ms=(float(low), float(high)),
        gain_pct=100.0 * gain / base_ms if base_ms > 0 else None,
        base_ms=base_ms,
        fixed_ms=float(fixed_means.mean()),
        rounds=rounds,
    )


__all__ = ["PairedGain", "paired_gain"]
