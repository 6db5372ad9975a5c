"""What the counter level's table calls things, shared by its conversion (``xsp.tracer.convert.ncu``)
and its analysis (``xsp.analysis.tables.counters``): the precisions and derived columns, and the kernel
names both CUPTI and Nsight Compute spell alike."""

from __future__ import annotations

import re

__all__ = ["DERIVED", "PRECISIONS", "kernel_base", "kernel_key"]

#: Precisions, highest first, and what each counts: CUDA-core instructions (add, mul, fma)
#: and a tensor-path quantity.
PRECISIONS: dict[str, tuple[str | None, str | None]] = {
    "fp64": ("d", "tensor_fp64_ops"),
    "fp32": ("f", None),
    "tf32": (None, "tensor_tf32_ops"),
    "fp16": ("h", "tensor_fp16_ops"),
    "bf16": (None, "tensor_bf16_ops"),
    "fp8": (None, "tensor_fp8_ops"),
}
#: The counter table's derived columns, in order (the raw metrics follow them).
DERIVED = (
    *(f"flops_{p}" for p in PRECISIONS),
    "tensor_flops",
    "flops",
    "dram_read_bytes",
    "dram_write_bytes",
    "l2_bytes",
    "occupancy_pct",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "ncu_duration_ns",
)


def kernel_key(name: str) -> str:
    """A kernel name as both CUPTI and ncu spell it: the ``void`` return type and the parameter
    list dropped, whitespace collapsed (demanglers differ in spacing and may leave parameter
    lists out). ``void at::native::f<float>(int, float*)`` -> ``at::native::f<float>``."""
    text = " ".join(name.split())
    if text.startswith("void "):
        text = text[5:]
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            char = text[i]
            if char in ")>":
                depth += 1
            elif char in "(<":
                depth -= 1
                if depth == 0:
                    if char == "(":
                        text = text[:i]
                    break
    return text.replace(" <", "<").replace("< ", "<").replace(" >", ">").strip()


def kernel_base(name: str) -> str:
    """A kernel's own function name, the one part of its name both tools always spell alike:
    ``kernel_key`` with every template argument list and every enclosing scope dropped, and no
    whitespace. CUPTI and ncu demangle differently beyond it (on the H200 ncu 2025.3 drops
    scopes, ``cudnn::engines_precompiled::`` -> ``engines_precompiled::``, ``at::native::`` ->
    ``at::``; writes template values as numbers, ``true`` -> ``1``; ``(anonymous namespace)``
    as ``<unnamed>``; and parameters as ``T1``, ``T2``), and CUPTI leaves a few names mangled
    (``_ZN17cutlass__5x_cudnn6KernelI...`` -> ``Kernel``). ``void at::native::f<float>(int)``
    -> ``f``."""
    text = kernel_key(name)
    if text.startswith("_Z"):
        return _mangled_base(text) or text
    out: list[str] = []
    depth = 0
    for char in text:
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(char)
    scopes = [part for part in "".join(out).split("::") if part.strip()]
    return "".join(scopes[-1].split()) if scopes else "".join(text.split())


def _mangled_base(name: str) -> str | None:
    """The last source name of an Itanium-mangled function's (nested) name, before its
    template arguments: ``_ZN17cutlass__5x_cudnn6KernelINS_4conv...`` -> ``Kernel``."""
    i = 3 if name.startswith("_ZN") else 2
    last = None
    while i < len(name):
        digits = re.match(r"\d+", name[i:])
        if digits:
            start = i + digits.end()
            last = name[start : start + int(digits.group())]
            i = start + int(digits.group())
        elif name.startswith("St", i):
            i += 2
        elif name[i] == "S":  # a substitution (S_, S0_, ...): an earlier scope
            end = name.find("_", i)
            if end < 0:
                break
            i = end + 1
        elif name[i] in "KVr" and i < 4:  # cv-qualifiers of a member function
            i += 1
        else:
            break
    return last
