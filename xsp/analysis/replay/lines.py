"""The replay's checks and warnings as lines of text, from its typed result: what the terminal
prints under the replayed step (``xsp.cli.render``) and the HTML report's first screen shows."""

from __future__ import annotations

from xsp.analysis.replay.result import ReplayResult

__all__ = ["check_lines", "replay_warnings"]


def check_lines(found: ReplayResult) -> list[str]:
    """The two checks that ran, one line each (``xsp.analysis.replay.checks``)."""
    from xsp.analysis.replay.m_interval import COVERAGE

    lines = []
    own = found.in_process
    if own is not None:
        lines.append(
            f"in-process check: {own.error_pct:+.1f}% against the {own.run} process's "
            f"untraced {own.untraced_ms:.3f} ms ({len(own.checked_iterations)} held-out "
            f"of {own.pairs} untraced/traced pairs; within {own.tolerance_pct:g}%: "
            f"{'yes' if own.holds else 'no'})"
        )
    across = found.m_interval
    if across is not None and across.interval.processes > 1:
        interval = across.interval
        each = ", ".join(f"{ms:.3f}" for ms in interval.process_medians_ms)
        lines.append(
            f"across processes: {across.position} M's {COVERAGE:.0%} interval "
            f"{interval.low_ms:.3f}-{interval.high_ms:.3f} ms over {interval.processes} "
            f"processes (their medians {each} ms)"
        )
    return lines


def replay_warnings(found: ReplayResult) -> list[str]:
    """Why the replayed step may be off: the F run measured no cost of its own to take off the
    host's times, a check could not run (``unchecked``), or a check did not hold."""
    from xsp.analysis.replay.host_timeline import NO_CALIBRATION
    from xsp.analysis.replay.m_interval import Position

    lines = []
    if NO_CALIBRATION in found.calibration.source:
        lines.append(
            f"{found.calibration.source} (a store older than the probe): the host's times "
            "keep the tracer's cost, so the replayed step and its verdict overstate host work; "
            "record it again to read them"
        )
    lines += [f"unchecked {why}" for why in found.unchecked]
    own = found.in_process
    if own is not None and not own.holds:
        lines.append(
            f"the replayed step is {own.error_pct:+.1f}% off the {own.run} process's own "
            f"held-out untraced steps ({own.untraced_ms:.3f} ms): the host changed speed "
            "within that process, or F's cost per record is not one figure for this workload"
        )
    across = found.m_interval
    if across is not None and across.interval.processes > 1 and across.position != Position.INSIDE:
        interval = across.interval
        lines.append(
            f"the replayed step {across.replayed_ms:.3f} ms is {across.position} M's "
            f"interval {interval.low_ms:.3f}-{interval.high_ms:.3f} ms: the F process's host "
            "ran at another speed than M's processes did"
        )
    return lines
