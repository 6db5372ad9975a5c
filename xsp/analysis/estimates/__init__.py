"""Estimates of kernel-changing fixes from their ops timed in isolation: which ops a fix touches
(``cases``) and the step replayed with their timed ratios (``replayed``). The timing itself runs
on the measurement's device, in ``xsp estimate`` (``xsp.tracer.workloads.isolation``)."""

from xsp.analysis.estimates.cases import TOUCHED, Affected, affected
from xsp.analysis.estimates.replayed import (
    ISOLATION,
    IsolationEstimate,
    isolation_edit,
    isolation_estimate,
    kernels_to_scale,
    row_factors,
)

__all__ = [
    "ISOLATION",
    "TOUCHED",
    "Affected",
    "IsolationEstimate",
    "affected",
    "isolation_edit",
    "isolation_estimate",
    "kernels_to_scale",
    "row_factors",
]
