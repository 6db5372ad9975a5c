"""Short kernel names for trace viewers: a C++ kernel signature or an Itanium-mangled symbol
reduced to its function's own name, plus the first type among its template arguments where that
tells instances apart, e.g.::

    void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, …)
        -> bn_bw_1C11_kernel_new
    void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, …>(…)
        -> vectorized_elementwise_kernel<CUDAFunctor_add>
    _ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionI…
        -> Kernel<ImplicitGemmConvolution>

Plain C names (``sm90_xmma_gemm_…_kernel__5x_cublas``, ``Memset``) are kept: their length is
their configuration, and cutting it would make different kernels look the same. The full name
stays on the span (``schema.ATTR_KERNEL_NAME``).

Algorithm (signatures):
1. ``(anonymous namespace)::`` and a leading ``void`` go.
2. The function's qualified name ends at the first ``<`` or ``(`` outside brackets; its last
   ``::`` component is the name.
3. The template arguments are split at top-level commas; the first that names a type other than
   a number, a literal or a built-in scalar (``float``, ``float2``, ``c10::Half``) is reduced the
   same way (steps 2) and appended in ``<…>``.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["short_kernel_name"]

_ANONYMOUS = "(anonymous namespace)::"
_OPEN = {"<": ">", "(": ")", "{": "}", "[": "]"}
_CLOSE = set(_OPEN.values())
#: Template arguments that tell nothing apart: scalars, CUDA vector types, literals.
_BUILTIN = re.compile(
    r"^(const\s+)?((unsigned|signed)\s+)?"
    r"(float|double|int|long|short|char|bool|half|__half|__nv_bfloat16|bfloat16|"
    r"c10::Half|c10::BFloat16|at::Half|at::BFloat16|size_t|u?int\d+_t|"
    r"(float|double|int|uint|long|ulong|short|char|uchar|half)[1-4]|long\s+long|void)"
    r"(\s*(const|\*|&))*$"
)
_LITERAL = re.compile(r"^[-+(]|^\d|^(true|false)$")
_MANGLED_NAME = re.compile(r"(\d+)")


@lru_cache(maxsize=4096)
def short_kernel_name(name: str) -> str:
    """The short form of ``name`` (``name`` itself when it has no C++ syntax to strip)."""
    if name.startswith("_Z"):
        return _demangled_core(name) or name
    if not any(c in name for c in "<(:"):
        return name
    text = name.replace(_ANONYMOUS, "")
    if text.startswith("void "):
        text = text[len("void ") :]
    core, rest = _qualified_name(text)
    short = core.rsplit("::", 1)[-1] or name
    if rest.startswith("<"):
        for argument in _template_arguments(rest):
            if not (_BUILTIN.match(argument) or _LITERAL.match(argument)):
                inner = _qualified_name(argument)[0].rsplit("::", 1)[-1]
                if inner:
                    return f"{short}<{inner}>"
                break
    return short


def _qualified_name(text: str) -> tuple[str, str]:
    """(the name before the first ``<`` or ``(`` outside brackets, the rest)."""
    for at, char in enumerate(text):
        if char in "<(":
            return text[:at].strip(), text[at:]
    return text.strip(), ""


def _template_arguments(text: str) -> list[str]:
    """The top-level arguments of the ``<…>`` that ``text`` starts with."""
    arguments, depth, start = [], 0, 1
    for at, char in enumerate(text):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth == 0:
                arguments.append(text[start:at].strip())
                break
        elif char == "," and depth == 1:
            arguments.append(text[start:at].strip())
            start = at + 1
    return [a for a in arguments if a]


def _demangled_core(symbol: str) -> str | None:
    """``Name`` or ``Name<FirstTemplateArgument>`` of an Itanium-mangled function name, read
    from its length-prefixed identifiers (a partial demangler: enough for a label)."""
    names, at = _nested_names(symbol, 3 if symbol.startswith("_ZN") else 2)
    if not names:
        return None
    if at < len(symbol) and symbol[at] == "I":
        inner, _ = _nested_names(symbol, at + 1)
        if inner:
            return f"{names[-1]}<{inner[-1]}>"
    return names[-1]


def _nested_names(symbol: str, at: int) -> tuple[list[str], int]:
    """The identifiers of the nested name starting at ``at`` (substitutions such as ``S_`` and
    qualifiers skipped), and where it stopped (at ``I``, ``E`` or anything else)."""
    names: list[str] = []
    while at < len(symbol):
        char = symbol[at]
        if char.isdigit():
            found = _MANGLED_NAME.match(symbol, at)
            if found is None:
                break
            length = int(found.group(1))
            start = found.end()
            names.append(symbol[start : start + length])
            at = start + length
        elif char == "S":  # a substitution: S_, S0_, S1_, …
            end = symbol.find("_", at)
            if end < 0:
                break
            at = end + 1
        elif char in "NKLVr":  # nested-name start and qualifiers
            at += 1
        else:
            break
    return names, at
