"""A real Ray cluster of several nodes on this machine, for the campaign tests: each node is a
``ray start --block`` of its own, in a session of its own, with its own temp dir, CPUs and custom
resource, so a test can kill one node (every process it started, as a dead machine would lose
them) and leave the others running. Nodes are stopped by their pids, never by ``ray stop``
(which stops every Ray of the machine)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures import free_ports

ROOT = Path(__file__).resolve().parents[1]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
#: Small enough for a 2-core machine: one CPU and a 100 MB object store a node.
OBJECT_STORE_BYTES = 100_000_000


class RayNode:
    """One node: ``ray start --block`` and everything it starts."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [*RAY, "start", "--block", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_started(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.5)

    def pids(self) -> set[int]:
        """The node's processes: its session's, and every descendant of them (a job's fork
        server and level-set processes start sessions of their own)."""
        parents: dict[int, int] = {}
        sessions: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                parents[int(entry.name)] = int(fields[1])
                sessions[int(entry.name)] = int(fields[3])
        found = {pid for pid, sid in sessions.items() if sid == self.process.pid}
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in found} - found
            found |= more
            grew = bool(more)
        return found

    def kill(self) -> None:
        """SIGKILL every process of the node, as if its machine had died."""
        for _ in range(3):  # a process may fork while the others die
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        self.process.wait(10)


class RayCluster:
    """A head, and worker nodes added with ``add_worker``; ``env`` is every node's and the
    driver's (token authentication on, with a token of the cluster's own, and ``extra``: an
    object store's AWS variables); a node may add its own (a ``TMPDIR``)."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        # Ray's sockets live in its temp dir, whose path must stay short (107 bytes a socket)
        self.tmp = Path(tempfile.mkdtemp(prefix="xsp-ray-"))
        self.port, self.client_port, self.dashboard_port = free_ports(3)
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": os.urandom(16).hex(),
            "RAY_USAGE_STATS_ENABLED": "0",
            **(extra or {}),
        }
        self.nodes: list[RayNode] = []

    def _start(
        self, name: str, args: list[str], env: dict[str, str] | None = None, tries: int = 4
    ) -> RayNode:
        """Start a node; on a loaded machine a start can time out (Ray waits 30 s for its
        raylet to register): try again."""
        for attempt in range(tries):
            # no agent port given: the raylet then goes on without an agent that starts late
            # (one that was given a port it waits for, 15 s, then dies)
            common = [
                "--num-cpus=1",
                "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.tmp / f'{name}-{attempt}'}",
                f"--resources={json.dumps({f'node_{name}': 1})}",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                "--include-log-monitor=false",  # one Python process fewer to start
            ]
            node = RayNode(
                [*args, *common], {**self.env, **(env or {})}, self.tmp / f"{name}-{attempt}.log"
            )
            self.nodes.append(node)
            try:
                node.wait_started()
                return node
            except RuntimeError:
                node.kill()
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def start_head(self, env: dict[str, str] | None = None) -> RayNode:
        return self._start(
            "head",
            [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={self.client_port}",
                f"--dashboard-port={self.dashboard_port}",
                "--include-dashboard=false",
            ],
            env,
        )

    def add_worker(self, name: str, env: dict[str, str] | None = None) -> RayNode:
        return self._start(name, [f"--address={self.address}"], env)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
