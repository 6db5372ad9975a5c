"""Where a level-set process ran, read from ``/proc`` as it starts and ends measuring.

A host-bound step moved by up to ±25% between processes with nothing changed on the lent GPU
hosts. To tell where that comes from (the core a process landed on, the core's clock, other work
on the machine), each process keeps in ``run.json`` (``host``) the core it last ran on, the
cores it may run on, that core's clock, the load average and its own voluntary and involuntary
context switches, at the start of its measured iterations and at their end. Reading them costs
well under a millisecond, outside every timed iteration; where ``/proc`` lacks one (not Linux,
a container that hides it) that field is left out.
"""

from __future__ import annotations

import contextlib
import os

from xsp.core.run_sections import HostState

__all__ = ["host_state"]


def _last_cpu() -> int | None:
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[36])  # field 39 of stat(5), "processor", counted after the name
    except (OSError, ValueError, IndexError):
        return None


def _cpu_mhz(cpu: int) -> float | None:
    """The core's clock: cpufreq's where the kernel has it, else /proc/cpuinfo's."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq") as freq:
            return int(freq.read()) / 1000.0
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as info:
            current = -1
            for line in info:
                if line.startswith("processor"):
                    current = int(line.split(":")[1])
                elif line.startswith("cpu MHz") and current == cpu:
                    return float(line.split(":")[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _switches() -> HostState:
    found: HostState = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == "voluntary_ctxt_switches":
                    found["voluntary_ctxt_switches"] = int(value)
                elif key == "nonvoluntary_ctxt_switches":
                    found["nonvoluntary_ctxt_switches"] = int(value)
    except (OSError, ValueError):
        pass
    return found


def host_state() -> HostState:
    """The process's core, its allowed cores, the core's clock, the load, its switches."""
    state: HostState = {}
    cpu = _last_cpu()
    if cpu is not None:
        state["cpu"] = cpu
        mhz = _cpu_mhz(cpu)
        if mhz is not None:
            state["cpu_mhz"] = round(mhz, 1)
    with contextlib.suppress(AttributeError, OSError):
        state["cpus_allowed"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        state["load_1m"] = round(os.getloadavg()[0], 2)
    state.update(_switches())
    return state
