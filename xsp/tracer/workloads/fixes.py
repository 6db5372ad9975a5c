"""Fixes xsp applies to a workload without editing its code: the registry ``FIXES``.

Each fix is one small unit: its name, whether it changes numerics, and how it applies. A fix
applies in the traced process before the workload starts (``xsp run --fix NAME``, and ``xsp
verify``, which re-runs a measurement with the fix its suggestion names), in two places:

1. ``process``: process-wide switches, set once before the program runs (TF32, cuDNN's
   autotuner, the DataLoader's defaults, the caching allocator's settings);
2. ``root``: the root module (the model), changed once before its first forward pass
   (channels_last, bf16 autocast, torch.compile, CUDA graphs). A zoo model is known before it runs; for an
   unmodified script the root module is the first ``nn.Module`` with parameters called outside
   any other module call (not a transform or a loss), found as the automatic iterations find it
   (``xsp.tracer.capture.iterations.RootFinder``).

Names are validated here without importing torch (``check``), since the spec validates them
in every process that parses one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from xsp.core.errors import ConfigError

log = logging.getLogger(__name__)

#: DataLoader workers the ``dataloader`` fix gives a loader built with none: one per CPU core
#: this process may run on, at most this many.
MAX_LOADER_WORKERS = 8
#: Batches each worker loads ahead (torch's own default once workers are on).
LOADER_PREFETCH_FACTOR = 2


@dataclass(frozen=True)
class FixContext:
    """What a fix needs to know: the device the workload runs on (``cpu``, ``cuda[:N]``)."""

    device: str

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class Fix:
    """One fix: ``process(context)`` runs once before the program starts, ``root(module,
    context)`` once on the root module before its first forward pass; either may be None."""

    name: str
    summary: str
    changes_numerics: bool
    process: Callable[[FixContext], None] | None = None
    root: Callable[[Any, FixContext], None] | None = None
    #: its ``process`` part sets only torch's switches (``switches``): one process can run the
    #: workload with and without it, switching between blocks (``xsp verify --in-process``)
    switches_only: bool = False

    @property
    def in_one_process(self) -> bool:
        """Whether one process can run the workload with and without the fix: a root fix
        applies to a second copy of the model, a switch can be set and reset."""
        return self.process is None or self.switches_only


# -- channels_last ---------------------------------------------------------------------------------
def _channels_last_root(module: Any, context: FixContext) -> None:
    """NHWC weights now, and every 4-D floating input NHWC at each call (a pre-hook): cuDNN then
    runs its convolutions without transposing activations to NHWC and back."""
    import torch

    # in place (Parameter.data), so an optimizer built already keeps the same parameters
    module.to(memory_format=torch.channels_last)

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value

    def inputs_nhwc(
        _: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], dict[str, object]]:  # a forward's inputs: any values
        return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}

    module.register_forward_pre_hook(inputs_nhwc, with_kwargs=True)


# -- TF32 and cuDNN's autotuner --------------------------------------------------------------------
@dataclass(frozen=True)
class Switches:
    """torch's switches a ``switches_only`` fix may set (TF32's). cuDNN's autotuner is not one:
    the algorithms it picks, or its heuristics picked without it, are cached for the process by
    a key that leaves ``benchmark`` out, so switching it back and forth in one process would
    time the first side's choice on both."""

    matmul_tf32: bool
    cudnn_tf32: bool
    float32_matmul_precision: str

    @classmethod
    def current(cls) -> Switches:
        import torch

        return cls(
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
        )

    def set(self) -> None:
        """The precision last, since setting it sets cuBLAS's TF32 switch too (set first, the
        legacy switch would then disagree with it, and torch 2.9+ raises on reading a
        precision set both ways)."""
        import torch

        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.set_float32_matmul_precision(self.float32_matmul_precision)


@contextlib.contextmanager
def switched(name: str, context: FixContext) -> Iterator[None]:
    """Fix ``name``'s switches on inside, and back as they were after: a ``switches_only`` fix
    (any other fix changes nothing here)."""
    fix = FIXES[name]
    if not fix.switches_only or fix.process is None:
        yield
        return
    before = Switches.current()
    fix.process(context)
    try:
        yield
    finally:
        before.set()


def _tf32_process(context: FixContext) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")


def _cudnn_benchmark_process(context: FixContext) -> None:
    import torch

    torch.backends.cudnn.benchmark = True


# -- bf16 autocast ---------------------------------------------------------------------------------
def _bf16_root(module: Any, context: FixContext) -> None:
    """The root module's forward under ``torch.autocast(device, bfloat16)``: its own forward
    attribute, which ``nn.Module.__call__`` calls (the loss outside it stays fp32)."""
    import torch

    device_type = "cuda" if context.on_cuda else "cpu"
    forward = module.forward

    @functools.wraps(forward)
    def forward_bf16(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    module.forward = forward_bf16


# -- torch.compile ---------------------------------------------------------------------------------
def _compile_root(module: Any, context: FixContext) -> None:
    """``module.compile()``: in place, so the call that found the root runs compiled already.
    A graph the compiler cannot build runs eagerly instead of failing the program
    (``suppress_errors``): a fix must never crash the traced program."""
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    module.compile()


def _cuda_graphs_root(module: Any, context: FixContext) -> None:
    """``module.compile(mode="reduce-overhead")``: inductor's kernels replayed from CUDA graphs
    (one launch for a whole graph instead of one per kernel), which is what the launch-bound
    rule's estimate models. On the CPU the mode compiles without graphs."""
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    module.compile(mode="reduce-overhead")


# -- the caching allocator -------------------------------------------------------------------------
#: The caching allocator's settings the ``alloc_conf`` fix sets: segments that grow in place
#: instead of new blocks per size, against the fragmentation that holds memory a step frees.
ALLOC_CONF = "expandable_segments:True"


def _alloc_conf_process(context: FixContext) -> None:
    """``PYTORCH_CUDA_ALLOC_CONF``, read when CUDA's allocator starts, so set before the program
    runs. A setting the program's environment gave is kept, and the fix says it did nothing."""
    given = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if given:
        raise RuntimeError(f"PYTORCH_CUDA_ALLOC_CONF is set already ({given!r}); left as it is")
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError("CUDA started before the fix: the allocator's settings are read then")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF


# -- DataLoader defaults ---------------------------------------------------------------------------
def loader_workers() -> int:
    """The workers the ``dataloader`` fix gives a loader built with none."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_LOADER_WORKERS))


def _dataloader_process(context: FixContext) -> None:
    """Every DataLoader built with no workers gets ``loader_workers()`` of them, persistent
    (started once, not at each epoch), each ``LOADER_PREFETCH_FACTOR`` batches ahead, and on
    CUDA pinned memory (asynchronous host-to-device copies). Settings the program gave are kept;
    an IterableDataset keeps no workers: each worker would yield the whole stream."""
    from torch.utils.data import DataLoader, IterableDataset

    original = DataLoader.__init__
    if getattr(original, "_xsp_fix", False):
        return
    signature = inspect.signature(original)
    workers = loader_workers()

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # torch says what is wrong
        given = bound.arguments  # what the program passed, by position or by name
        if given.get("num_workers", 0) == 0 and not isinstance(
            given.get("dataset"), IterableDataset
        ):
            given["num_workers"] = workers
            given.setdefault("persistent_workers", True)
            if given.get("prefetch_factor") is None:
                given["prefetch_factor"] = LOADER_PREFETCH_FACTOR
        if context.on_cuda and "pin_memory" not in given:
            given["pin_memory"] = True
        original(*bound.args, **bound.kwargs)

    init._xsp_fix = True  # type: ignore[attr-defined]
    DataLoader.__init__ = init  # type: ignore[method-assign]


FIXES: dict[str, Fix] = {
    fix.name: fix
    for fix in (
        Fix(
            "channels_last",
            "NHWC weights and 4-D inputs (torch.channels_last)",
            changes_numerics=False,
            root=_channels_last_root,
        ),
        Fix(
            "tf32",
            "TF32 tensor-core math for fp32 matmuls and convolutions",
            changes_numerics=True,
            process=_tf32_process,
            switches_only=True,
        ),
        Fix(
            "bf16",
            "bf16 autocast around the model's forward pass",
            changes_numerics=True,
            root=_bf16_root,
        ),
        Fix(
            "cudnn_benchmark",
            "cuDNN picks each convolution's fastest algorithm by timing them",
            changes_numerics=False,
            process=_cudnn_benchmark_process,
        ),
        Fix(
            "dataloader",
            "DataLoader workers, persistent, prefetching (pinned memory on CUDA)",
            changes_numerics=False,
            process=_dataloader_process,
        ),
        Fix(
            "compile",
            "torch.compile of the model (eager where a graph cannot compile)",
            changes_numerics=False,
            root=_compile_root,
        ),
        Fix(
            "cuda_graphs",
            "torch.compile of the model in mode reduce-overhead: its kernels replayed from CUDA graphs",
            changes_numerics=False,
            root=_cuda_graphs_root,
        ),
        Fix(
            "alloc_conf",
            f"the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF={ALLOC_CONF})",
            changes_numerics=False,
            process=_alloc_conf_process,
        ),
    )
}


def check(names: Iterable[str]) -> tuple[str, ...]:
    """The names, each once, in order; ConfigError naming an unknown one."""
    found = tuple(dict.fromkeys(names))
    for name in found:
        if name not in FIXES:
            raise ConfigError(f"unknown fix {name!r}: use one of {', '.join(FIXES)}")
    return found


class AppliedFixes:
    """The fixes of one process: ``apply`` their process-wide parts now; ``attach`` their
    root-module parts to the model (a zoo model as built; for an unmodified script, the first
    module with parameters it calls, through ``RootFinder(fixes.attach)``). A fix that fails is logged, passed to ``on_error`` (the session
    writes it into run.json) and skipped: never an exception into the traced program."""

    def __init__(
        self, names: Iterable[str], device: str, on_error: Callable[[str], None] | None = None
    ) -> None:
        self.fixes = [FIXES[name] for name in check(names)]
        self.context = FixContext(device)
        self.errors: list[str] = []
        self._on_error = on_error
        self._attached = False

    @property
    def names(self) -> list[str]:
        return [fix.name for fix in self.fixes]

    @property
    def roots(self) -> list[Fix]:
        return [fix for fix in self.fixes if fix.root is not None]

    def apply(self) -> AppliedFixes:
        for fix in self.fixes:
            if fix.process is not None:
                self._run(fix, fix.process, self.context)
        return self

    def attach(self, module: Any) -> None:
        """Apply the root-module fixes to ``module`` (once)."""
        if self._attached:
            return
        self._attached = True
        for fix in self.roots:
            if fix.root is not None:
                self._run(fix, fix.root, module, self.context)

    def _run(self, fix: Fix, function: Callable[..., None], *args: Any) -> None:
        try:
            function(*args)
        except Exception as exc:
            message = f"fix {fix.name} could not apply: {type(exc).__name__}: {exc}"
            log.error("xsp: %s", message)
            self.errors.append(message)
            if self._on_error is not None:
                self._on_error(message)


__all__ = [
    "FIXES",
    "AppliedFixes",
    "Fix",
    "FixContext",
    "Switches",
    "check",
    "loader_workers",
    "switched",
]
