"""How long a process has run, from the kernel's record of it (``/proc/<pid>/stat``): for
``xsp run``'s own start-up (its interpreter and imports count) and for telling a level-set
process that a killed campaign left running from a process that reuses its pid."""

from __future__ import annotations

import os
import time

__all__ = ["process_age_ns"]


def process_age_ns(pid: int | str = "self") -> int | None:
    """Nanoseconds since the process ``pid`` started; None where there is none, or only a
    zombie (it has ended), or no ``/proc`` (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        if fields[0] == b"Z":
            return None
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: since boot
        return max(0, time.clock_gettime_ns(time.CLOCK_BOOTTIME) - int(started_s * 1e9))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
