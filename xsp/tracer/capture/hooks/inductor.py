"""Where torch.compile's generated kernels came from: inductor's provenance, kept for level F.

A fused Triton (GPU) or C++ (CPU) kernel runs inside one compiled region, so by nesting alone
it belongs to the module that called the compiled model. Inductor knows better: each kernel it
defines is built from FX nodes whose ``nn_module_stack`` (``fwd_nn_module_stack`` in a
backward graph) names the module each node was traced in. While level F is configured we wrap
inductor's ``define_kernel`` of the Triton and C++ schedulers and keep, per (phase, kernel
name), the modules of each definition in the order the wrapper code calls them; conversion
(``xsp.tracer.convert.compiled``) gives each launched kernel the module that holds its nodes.

Inductor reuses one kernel for identical code (two identical blocks), and its kernel names
restart in each graph, so a name can stand for several definitions; the k-th launch in a
compiled region takes the k-th definition when the counts agree, else their common module.

Library work (cuBLAS matmuls, cuDNN or oneDNN convolutions) is not generated: the wrapper code
calls it as an aten op (``extern_kernels.addmm``, ``aten.convolution_backward``), so it runs as
that op inside the compiled region. We wrap the scheduler's ``codegen_extern_call`` and keep, per
compiled graph, its phase and its extern calls in wrapper order, each with its aten op's name and
its source modules; conversion matches them to the ops of each run of a compiled region.

Kernels are only defined when inductor compiles, not when it loads a graph from its FX-graph
or AOTAutograd cache. So the provenance travels in the cache: each graph inductor saves carries
the provenance recorded while it was compiled (an attribute pickled with the entry), and a
graph loaded from the cache gives its provenance back. For this to be never wrong, every cache
key a traced process computes is salted with the module each node of the graph was traced in
(the caches' own keys leave node metadata out, so two blocks of the same code share a key) and
with xsp's provenance version: an entry found under such a key was compiled, by a traced
process, from the same code and the same modules. A leveled measurement thus compiles once:
its first level set compiles and saves, the others load (``xsp.tracer.run.environment`` gives it a
cache directory of its own). Every traced process, level set M included, installs this, so
that all compile the same code: on CPU each generated kernel gets a profiler range
(``cpp.enable_kernel_profile``), so that compiled CPU code shows as spans at all. Nothing of
this is imported before the program imports inductor itself: an import hook applies it when
those modules load.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import logging
import re
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from xsp.core.records import ExternGraph
from xsp.core.run_sections import RunCounts

__all__ = ["CARRIED", "SALT_VERSION", "KernelProvenance", "module_path", "resolve", "salted"]

log = logging.getLogger(__name__)

#: What each inductor module gets when it loads: configuration, or a wrapped define_kernel.
_CONFIG = "torch._inductor.config"
_SCHEDULERS = {
    "torch._inductor.codegen.triton": "TritonScheduling",
    "torch._inductor.codegen.cpp": "CppScheduling",
}
_SCHEDULER = "torch._inductor.scheduler"
#: Inductor's FX-graph cache and AOTAutograd's: salted keys, and provenance carried in entries.
_FX_CACHE = "torch._inductor.codecache"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"

#: The attribute of a cached compiled graph that carries its provenance.
CARRIED = "_xsp_provenance"
#: Mixed into every salted key: change it when what an entry carries changes.
SALT_VERSION = "xsp-provenance-1"


#: ``L['self'].layer1[0]._modules['conv1']`` and the like, as dynamo spells module paths.
_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\]")
_ITEM = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[['\"]?([^'\"\]]+)['\"]?\]")


def module_path(dynamo_path: str) -> str:
    """A dynamo module path relative to the compiled root, as ``named_modules`` spells it:
    ``L['self'].layer1[0]._modules['conv1']`` -> ``layer1.0.conv1``."""
    rest = _ROOT.sub("", dynamo_path)
    rest = _ITEM.sub(lambda m: "." + (m.group(1) or m.group(2)), rest)
    return rest.strip(".")


class KernelProvenance:
    """Inductor's kernel definitions seen while installed, with their source modules'
    paths relative to the compiled root; ``sources`` resolves them against the run's."""

    def __init__(self) -> None:
        #: ``"<phase> <kernel name>"`` -> the source modules of each definition, in order
        self.definitions: dict[str, list[list[str]]] = {}
        #: per compiled graph, in compilation order: its frame, phase and extern calls
        self.extern_graphs: list[ExternGraph] = []
        #: graphs compiled (their provenance saved with them) and loaded from the cache
        self.saved = 0
        self.loaded = 0
        self._graph_slots: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # what was recorded since the graph being compiled got its key: saved with it
        self._unsaved_kernels: list[tuple[str, list[str]]] = []
        self._unsaved_graphs: list[int] = []
        self.failures = 0
        self._restore: list[Callable[[], None]] = []
        self._finder: _AfterImport | None = None

    @property
    def installed(self) -> bool:
        return bool(self._restore or self._finder)

    def install(self) -> None:
        """Prepare inductor (now, or when its modules load); again does nothing."""
        if self.installed:
            return
        actions = {
            _CONFIG: self._configure_inductor,
            **{name: self._wrap_scheduler for name in _SCHEDULERS},
            _SCHEDULER: self._wrap_extern_calls,
            _FX_CACHE: self._wrap_fx_cache,
            _AUTOGRAD_CACHE: self._wrap_autograd_cache,
        }
        pending = {}
        for name, action in actions.items():
            module = sys.modules.get(name)
            if module is not None:
                action(module)
            else:
                pending[name] = action
        if pending:
            self._finder = _AfterImport(pending)
            sys.meta_path.insert(0, self._finder)

    def sources(self, known: list[str]) -> dict[str, list[list[str]]]:
        """The definitions with module paths as the run's module table spells them."""
        full = _resolver(known)
        return {
            key: [[full(p) for p in modules] for modules in kernels]
            for key, kernels in self.definitions.items()
        }

    def snapshot(self) -> KernelProvenance:
        """What it holds now, apart (for a batch drained on another thread while compiling
        goes on), not installed."""
        copy = KernelProvenance()
        copy.definitions = dict(self.definitions)
        copy.extern_graphs = list(self.extern_graphs)
        return copy

    def extern_calls(self, known: list[str]) -> list[ExternGraph]:
        """The compiled graphs' extern calls with module paths as the run's table spells them."""
        full = _resolver(known)
        return [
            graph._replace(calls=[(op, [full(p) for p in modules]) for op, modules in graph.calls])
            for graph in self.extern_graphs
        ]

    def counts(self) -> RunCounts:
        """For run.json: the graphs inductor compiled and saved to its cache with their
        provenance, and those it loaded from there; none when nothing was compiled."""
        if not (self.saved or self.loaded):
            return {}
        return {"inductor_cache": {"saved": self.saved, "loaded": self.loaded}}

    def uninstall(self) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()

    # -- what each module gets ---------------------------------------------------------------
    def _set(self, target: Any, name: str, value: Any) -> None:
        if not hasattr(target, name):
            return
        # a class's own attribute as it is stored (a staticmethod stays one when put back)
        own = vars(target) if isinstance(target, type) else {}
        before = own[name] if name in own else getattr(target, name)
        setattr(target, name, value)
        self._restore.append(lambda: setattr(target, name, before))

    def _configure_inductor(self, config: ModuleType) -> None:
        self._set(config.cpp, "enable_kernel_profile", True)

    def _wrap_fx_cache(self, codecache: ModuleType) -> None:
        cache = getattr(codecache, "FxGraphCache", None)
        key_of: Any = getattr(codecache, "compiled_fx_graph_hash", None)
        save: Any = getattr(cache, "_save_graph", None)
        load: Any = getattr(cache, "load_with_key", None)
        bypass: Any = getattr(codecache, "BypassFxGraphCache", None)
        if None in (key_of, save, load, bypass):
            # no way to carry provenance: inductor compiles in every process instead
            log.info("compiled kernels: this torch's FX-graph cache is not known; it is off")
            self._configure_caches_off()
            return
        begin, carried, replay = self._begin_graph, self._carried, self._replay

        def compiled_fx_graph_hash(gm: Any, *args: Any, **kwargs: Any) -> Any:
            key, debug_lines = key_of(gm, *args, **kwargs)
            begin()
            try:
                return salted(key, gm), debug_lines
            except Exception as exc:  # an unsalted key could load another graph's provenance
                raise bypass(f"xsp could not key the graph's provenance: {exc}") from exc

        def save_graph(key: str, compiled_graph: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                setattr(compiled_graph, CARRIED, carried())
            except Exception:  # not saved: a process that needs the graph compiles it
                self._failed()
                return None
            saved = save(key, compiled_graph, *args, **kwargs)
            self.saved += 1
            return saved

        def load_with_key(*args: Any, **kwargs: Any) -> Any:
            graph, cache_info = load(*args, **kwargs)
            if graph is not None:
                replay(getattr(graph, CARRIED, None))
            return graph, cache_info

        self._set(codecache, "compiled_fx_graph_hash", compiled_fx_graph_hash)
        self._set(cache, "_save_graph", staticmethod(save_graph))
        self._set(cache, "load_with_key", staticmethod(load_with_key))

    def _wrap_autograd_cache(self, autograd_cache: ModuleType) -> None:
        key_of: Any = getattr(autograd_cache, "autograd_cache_key", None)
        bundled: Any = getattr(autograd_cache, "should_bundle_autograd_cache", None)
        bypass: Any = getattr(autograd_cache, "BypassAOTAutogradCache", None)
        if None in (key_of, bundled, bypass):
            log.info("compiled kernels: this torch's AOTAutograd cache is not known; it is off")
            self._configure_caches_off()
            return

        def autograd_cache_key(mod: Any, *args: Any, **kwargs: Any) -> Any:
            # an exception here is a bypass: AOTAutograd compiles, never fails for it
            if bundled():  # entries that hold their compiled graphs, past the FX-graph cache
                raise bypass("xsp: bundled entries would not carry the kernels' provenance")
            key, debug_lines = key_of(mod, *args, **kwargs)
            from torch._dynamo.utils import GmWrapper

            return salted(key, mod.gm if isinstance(mod, GmWrapper) else mod), debug_lines

        self._set(autograd_cache, "autograd_cache_key", autograd_cache_key)

    def _configure_caches_off(self) -> None:
        """Kernels are defined only when inductor compiles: where provenance cannot travel in
        its caches, they are off."""
        import torch._functorch.config as autograd_config
        import torch._inductor.config as inductor_config

        self._set(inductor_config, "fx_graph_cache", False)
        self._set(inductor_config, "fx_graph_remote_cache", False)
        self._set(autograd_config, "enable_autograd_cache", False)

    # -- provenance in the cache ------------------------------------------------------------
    def _begin_graph(self) -> None:
        """A graph got its cache key: what is recorded from now on is its provenance."""
        self._unsaved_kernels = []
        self._unsaved_graphs = []

    def _carried(self) -> dict[str, Any]:
        """The provenance recorded for the graph being saved, as its cache entry carries it."""
        graphs = [self.extern_graphs[slot] for slot in self._unsaved_graphs]
        carried = {
            "kernels": [[key, list(modules)] for key, modules in self._unsaved_kernels],
            "extern": [[g.phase, [[op, list(m)] for op, m in g.calls]] for g in graphs],
        }
        self._begin_graph()
        return carried

    def _replay(self, carried: Any) -> None:
        """A graph loaded from the cache: its provenance, as if it had just been compiled
        (its extern calls in the frame being compiled now)."""
        try:
            if carried is None:  # a salted key always has some: something else wrote it
                raise ValueError("a graph from inductor's cache carries no provenance")
            self.loaded += 1
            for key, modules in carried["kernels"]:
                self.definitions.setdefault(key, []).append(list(modules))
            frame = _compile_id()
            for phase, calls in carried["extern"]:
                graph = ExternGraph(frame, phase, [(op, list(m)) for op, m in calls])
                self.extern_graphs.append(graph)
        except Exception:
            self._failed()

    def _wrap_scheduler(self, codegen: ModuleType) -> None:
        scheduling = getattr(codegen, _SCHEDULERS[codegen.__name__], None)
        original = getattr(scheduling, "define_kernel", None)
        if original is None:
            return
        record = self._record

        def define_kernel(self: Any, src_code: Any, nodes: Any, *args: Any, **kwargs: Any) -> Any:
            name = original(self, src_code, nodes, *args, **kwargs)
            record(name, nodes)
            return name

        self._set(scheduling, "define_kernel", define_kernel)

    def _wrap_extern_calls(self, scheduler_module: ModuleType) -> None:
        scheduler = getattr(scheduler_module, "Scheduler", None)
        original = getattr(scheduler, "codegen_extern_call", None)
        if original is None:
            log.info(
                "compiled kernels: this torch's inductor has no Scheduler.codegen_extern_call; "
                "library kernels stay under their compiled region"
            )
            return
        record = self._record_extern

        def codegen_extern_call(self: Any, scheduler_node: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, scheduler_node, *args, **kwargs)
            record(scheduler_node)
            return out

        self._set(scheduler, "codegen_extern_call", codegen_extern_call)

    def _record(self, kernel_name: Any, nodes: Any) -> None:
        try:  # inductor's internals move between releases: never fail its compilation
            key = f"{_phase()} {kernel_name}"
            modules = _modules_of(_origins(nodes))
            self.definitions.setdefault(key, []).append(modules)
            self._unsaved_kernels.append((key, modules))
        except Exception:
            self._failed()

    def _record_extern(self, scheduler_node: Any) -> None:
        try:
            from torch._inductor.virtualized import V

            node = getattr(scheduler_node, "node", None)
            schema = getattr(getattr(node, "op_overload", None), "_schema", None)
            if schema is None:
                return  # no aten op runs (a MultiOutput picks a tuple's item)
            op = str(schema.name)  # "aten::addmm", as the profiler names the op
            origins = list(getattr(node, "origins", None) or ())
            # the FX node of the op itself, not the views and pointwise ops folded into it
            own = [o for o in origins if getattr(o.target, "_opname", None) == op.split("::")[-1]]
            slot = self._graph_slots.get(V.graph)
            if slot is None:
                slot = self._graph_slots[V.graph] = len(self.extern_graphs)
                self.extern_graphs.append(ExternGraph(_compile_id(), _phase(), []))
                self._unsaved_graphs.append(slot)
            self.extern_graphs[slot].calls.append((op, _modules_of(own or origins)))
        except Exception:
            self._failed()

    def _failed(self) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("compiled kernels: inductor's provenance could not be read", exc_info=True)


def _phase() -> str:
    """The phase of the graph inductor is compiling: AOTAutograd compiles both."""
    from torch._inductor.virtualized import V

    return "backward" if getattr(V.graph, "is_backward", False) else "forward"


def _compile_id() -> str:
    """The compile id of the frame whose graph inductor is compiling (a backward graph compiles
    in its forward's): what dynamo names that frame's runs with."""
    from torch._guards import CompileContext

    found = CompileContext.current_compile_id()
    return "" if found is None else str(found)


def salted(key: str, gm: Any) -> str:
    """A cache ``key`` of FX graph ``gm`` made to cover what provenance is made of: the module
    each node was traced in (the inductor and AOTAutograd keys leave node metadata out) and
    ``SALT_VERSION``. Same salted key, same provenance."""
    parts = [SALT_VERSION]
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
        parts.append(module_path(str(list(stack.values())[-1][0])) if stack else "")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]
    return f"{key}-xsp{digest}"


def _modules_of(origins: list[Any]) -> list[str]:
    """The distinct modules (relative paths) the FX nodes were traced in, in order."""
    modules: list[str] = []
    for origin in origins:
        if not origin.all_input_nodes:
            continue  # a constant, shared by every block that uses it (CSE)
        stack = origin.meta.get("nn_module_stack") or origin.meta.get("fwd_nn_module_stack")
        if stack:
            path = module_path(str(list(stack.values())[-1][0]))
            if path not in modules:
                modules.append(path)
    return modules


def _origins(nodes: Any) -> list[Any]:
    """The FX nodes a kernel's scheduler nodes (fused ones included) were lowered from."""
    found: list[Any] = []
    for node in nodes:
        parts = node.get_nodes() if hasattr(node, "get_nodes") else [node]
        for part in parts:
            found.extend(getattr(getattr(part, "node", None), "origins", None) or ())
    return found


def _resolver(known: list[str]) -> Callable[[str], str]:
    """``resolve`` against ``known``, each path resolved once."""
    cache: dict[str, str] = {}

    def full(path: str) -> str:
        if path not in cache:
            cache[path] = resolve(path, known)
        return cache[path]

    return full


def resolve(relative: str, known: list[str]) -> str:
    """A path relative to a compiled root as a path of the run's module table (``known``):
    the shortest known path that ends with it (``_orig_mod.layer1.0`` for ``layer1.0``)."""
    if relative in known:
        return relative
    tails = [p for p in known if p.endswith("." + relative)]
    return min(tails, key=len) if tails else relative


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs an action on a module right after it is first imported."""

    def __init__(self, actions: dict[str, Callable[[ModuleType], None]]) -> None:
        self._actions = actions

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        action = self._actions.pop(name, None)
        if action is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            try:
                action(module)
            except Exception:
                log.warning("compiled kernels: could not prepare %s", name, exc_info=True)

        loader.exec_module = exec_module
        return spec
