"""One rank of a multi-rank job: ``python -u -m xsp.tracer.run.rank [-m] SCRIPT ARGS``, the
command every worker of the launcher runs instead of the user's script (``xsp.tracer.run
.launcher``).

It reads the level set's spec from ``RANK_SPEC_ENV`` and its rank from the launcher's
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``, then runs the script as a level-set process would,
under a session that writes ``RUN_DIR/<levels>/rank-<RANK>/`` with the level set's shared run id
(so that an iteration is one trace across ranks). On CUDA each rank records its own GPU,
``cuda:<LOCAL_RANK>``. Rank 0 reports progress to the level-set process. A SIGTERM (the launcher
stopping the other ranks once one has failed) is taken as an interrupt, so that the rank stores
what it recorded before it exits.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from xsp.core.errors import ConfigError
from xsp.tracer.run import child
from xsp.tracer.run.protocol import RANK_SPEC_ENV, ChildSpec

__all__ = ["RANK_DIR", "main", "rank_spec"]

#: Where each rank's run goes inside its level set's directory.
RANK_DIR = "rank-{rank}"


def rank_spec(environ: dict[str, str], command: list[str]) -> ChildSpec:
    """The spec of this rank's session: the level set's, placed and numbered for this rank."""
    text = environ.get(RANK_SPEC_ENV)
    if not text:
        raise ConfigError(f"{RANK_SPEC_ENV} is not set: a rank process is started by xsp run")
    spec = ChildSpec.from_json(text, RANK_SPEC_ENV)
    try:
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", rank))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"a rank needs RANK and WORLD_SIZE from its launcher ({exc})") from exc
    device = spec.run.profile.device
    if device == "cuda":
        device = f"cuda:{local_rank}"
    run = dataclasses.replace(
        spec.run,
        out=str(spec.run_dir / RANK_DIR.format(rank=rank)),
        rank=rank,
        world_size=world_size,
    )
    return ChildSpec(
        run.with_profile(command=tuple(command), device=device),
        progress_path=spec.progress_path if rank == 0 else None,
    )


def main() -> int:
    try:
        spec = rank_spec(dict(os.environ), sys.argv[1:])
    except ConfigError as exc:
        print(f"xsp: {exc}", file=sys.stderr)
        return child.EXIT_XSP_ERROR
    signal.signal(signal.SIGTERM, child.on_interrupt)
    return child.main(spec)


if __name__ == "__main__":
    sys.exit(main())
