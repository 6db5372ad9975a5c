"""How many floating-point operations an aten op's math takes, from its input shapes alone.

The matmul, convolution and attention formulas are those of ``torch.utils.flop_counter``'s
``flop_registry`` (torch 2.15), rewritten here because the analysis stage never imports torch:
2 FLOPs per multiply-add, bias additions, softmax and scaling left out, attention counted
without its causal mask. ``tests/test_flops.py`` checks each against ``flop_registry`` on the
same shapes. ``torch.utils.flop_counter`` has no formula for the norms (it counts them as
zero); the norm formulas here are fvcore's estimate (``fvcore.nn.jit_handles``: 5 FLOPs per
input element with an affine weight, 4 without), forward only.

A formula takes the op's recorded input shapes (one list of ints per argument, ``[]`` for a
scalar or a list argument, whose values are not recorded) and what the op's own inputs cannot
say (``Context``: a convolution's output shape and whether it is transposed); it returns None
where the shapes do not fit the op's signature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

__all__ = [
    "ATTENTION",
    "CONVOLUTION",
    "DTYPE_ROOFS",
    "EXACT_FAMILIES",
    "FORMULAS",
    "MATMUL",
    "NORM",
    "Context",
    "Formula",
    "Shape",
    "conv_count",
]

Shape = Sequence[int]

MATMUL = "matmul"
CONVOLUTION = "convolution"
ATTENTION = "attention"
NORM = "norm"
#: The families counted as torch.utils.flop_counter counts them: the math exactly (the norms
#: are an estimate, and executed FLOPs are compared with these only).
EXACT_FAMILIES = (MATMUL, CONVOLUTION, ATTENTION)


@dataclass(frozen=True)
class Context:
    """What a formula needs beyond the op's input shapes: a forward convolution's output shape
    (``convolution`` records no output shapes, and its stride and padding values are not
    recorded) and whether the convolution is transposed (a scalar argument)."""

    output_shape: Shape | None = None
    transposed: bool = False


@dataclass(frozen=True)
class Formula:
    """One op's formula: its family, the index of the input whose dtype sets the precision the
    math ran at, how many inputs it reads, and the count."""

    family: str
    operand: int
    arity: int
    count: Callable[[Sequence[Shape], Context], int | None]

    def flops(self, shapes: Sequence[Shape], context: Context) -> int | None:
        """The op's FLOPs, or None where its recorded inputs do not fit the formula."""
        return self.count(shapes, context) if len(shapes) >= self.arity else None


def _mm(a: Shape, b: Shape) -> int | None:
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 2 * a[0] * a[1] * b[1]


def _bmm(a: Shape, b: Shape) -> int | None:
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        return None
    return 2 * a[0] * a[1] * a[2] * b[2]


def conv_count(x: Shape, w: Shape, out: Shape, transposed: bool = False) -> int:
    """``flop_counter.conv_flop_count``: each point of the output (of the input, transposed)
    takes the filter times input and output channels (the weight's channels are per group)."""
    spatial = (x if transposed else out)[2:]
    c_out, c_in, *kernel = w
    return 2 * prod(spatial) * prod(kernel) * x[0] * c_out * c_in


def _conv(shapes: Sequence[Shape], context: Context) -> int | None:
    x, w = shapes[0], shapes[1]
    out = context.output_shape
    if out is None or len(w) < 3 or len(x) != len(w) or len(out) != len(x):
        return None
    return conv_count(x, w, out, context.transposed)


def _swap(shape: Shape) -> list[int]:
    return [shape[1], shape[0], *shape[2:]]


def _conv_backward(shapes: Sequence[Shape], context: Context) -> int | None:
    """``flop_counter.conv_backward_flop`` with both gradients: ``output_mask`` (which of grad
    input and grad weight the op computes) is a list argument, not recorded; the input's
    gradient is counted even where none was needed (a network's first convolution)."""
    grad_out, x, w = shapes[0], shapes[1], shapes[2]
    if len(w) < 3 or not len(grad_out) == len(x) == len(w):
        return None
    grad_input = conv_count(grad_out, w, x, not context.transposed)
    if context.transposed:
        grad_weight = conv_count(_swap(grad_out), _swap(x), _swap(w))
    else:
        grad_weight = conv_count(_swap(x), _swap(grad_out), _swap(w))
    return grad_input + grad_weight


def _attention_shapes(q: Shape, k: Shape, v: Shape) -> tuple[int, int, int, int, int] | None:
    """(batch x query heads, query length, key length, head dim, value dim), or None; key and
    value heads may divide the query's (grouped-query attention)."""
    if not len(q) == len(k) == len(v) == 4:
        return None
    b, h, s_q, d = q
    if not (b == k[0] == v[0] and k[1] == v[1] and d == k[3] and k[2] == v[2]):
        return None
    if k[1] == 0 or h % k[1]:
        return None
    return b * h, s_q, k[2], d, v[3]


def _attention(shapes: Sequence[Shape], context: Context) -> int | None:
    """``flop_counter.sdpa_flop_count``: scores (q k^T) and their product with v."""
    found = _attention_shapes(shapes[0], shapes[1], shapes[2])
    if found is None:
        return None
    bh, s_q, s_k, d, d_v = found
    return 2 * bh * s_q * s_k * d + 2 * bh * s_q * s_k * d_v


def _attention_backward(shapes: Sequence[Shape], context: Context) -> int | None:
    """``flop_counter.sdpa_backward_flop_count``: the scores again, then the gradients of v,
    the scores, q and k (inputs: grad_out, q, k, v)."""
    found = _attention_shapes(shapes[1], shapes[2], shapes[3])
    if found is None or len(shapes[0]) != 4:
        return None
    bh, s_q, s_k, d, d_v = found
    scores_and_grad_q_k = 3 * (2 * bh * s_q * s_k * d)
    grad_scores_and_v = 2 * (2 * bh * s_q * s_k * d_v)
    return scores_and_grad_q_k + grad_scores_and_v


def _norm(weight: int) -> Callable[[Sequence[Shape], Context], int | None]:
    """fvcore's norm estimate; ``weight``: the index of the affine weight argument."""

    def count(shapes: Sequence[Shape], context: Context) -> int | None:
        if not shapes[0]:
            return None
        affine = len(shapes) > weight and len(shapes[weight]) > 0
        return prod(shapes[0]) * (5 if affine else 4)

    return count


def _on(f: Callable[[Shape, Shape], int | None], a: int, b: int) -> Formula:
    return Formula(MATMUL, a, max(a, b) + 1, lambda shapes, _: f(shapes[a], shapes[b]))


def _norm_of(weight: int) -> Formula:
    return Formula(NORM, 0, 1, _norm(weight))


_CONV = Formula(CONVOLUTION, 0, 2, _conv)
_ATTENTION = Formula(ATTENTION, 0, 3, _attention)
_ATTENTION_BACKWARD = Formula(ATTENTION, 1, 4, _attention_backward)

#: Formulas by op name as the framework level records it. Ops nest (``aten::linear`` calls
#: ``aten::addmm``; ``aten::convolution`` calls ``aten::cudnn_convolution``): only the
#: outermost op with a formula counts (``xsp.analysis.tables.flops``).
FORMULAS: dict[str, Formula] = {
    "aten::mm": _on(_mm, 0, 1),
    "aten::addmm": _on(_mm, 1, 2),
    "aten::_scaled_mm": _on(_mm, 0, 1),
    "aten::bmm": _on(_bmm, 0, 1),
    "aten::baddbmm": _on(_bmm, 1, 2),
    "aten::convolution": _CONV,
    "aten::_convolution": _CONV,
    "aten::cudnn_convolution": _CONV,
    "aten::convolution_overrideable": _CONV,
    "aten::_slow_conv2d_forward": _CONV,
    "aten::convolution_backward": Formula(CONVOLUTION, 0, 3, _conv_backward),
    "aten::_scaled_dot_product_efficient_attention": _ATTENTION,
    "aten::_scaled_dot_product_flash_attention": _ATTENTION,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _ATTENTION,
    "aten::_scaled_dot_product_cudnn_attention": _ATTENTION,
    "aten::_scaled_dot_product_efficient_attention_backward": _ATTENTION_BACKWARD,
    "aten::_scaled_dot_product_flash_attention_backward": _ATTENTION_BACKWARD,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _ATTENTION_BACKWARD,
    "aten::_scaled_dot_product_cudnn_attention_backward": _ATTENTION_BACKWARD,
    "aten::batch_norm": _norm_of(1),
    "aten::native_batch_norm": _norm_of(1),
    "aten::cudnn_batch_norm": _norm_of(1),
    "aten::layer_norm": _norm_of(2),
    "aten::native_layer_norm": _norm_of(2),
    "aten::group_norm": _norm_of(2),
    "aten::native_group_norm": _norm_of(1),
    "aten::rms_norm": _norm_of(2),
}

#: The tensor-core roof (``xsp.analysis.tables.peaks.ROOFS``) each operand dtype's math runs against:
#: fp32 against TF32's, the fastest fp32 convolutions and matmuls can go (cuDNN allows TF32 by
#: default); with TF32 off, fp32 math reaches at most the CUDA cores' fp32 roof.
DTYPE_ROOFS: dict[str, str] = {
    "double": "fp64_tensor",
    "float": "tf32_tensor",
    "c10::BFloat16": "bf16_tensor",
    "c10::Half": "fp16_tensor",
    "c10::Float8_e4m3fn": "fp8_tensor",
    "c10::Float8_e5m2": "fp8_tensor",
}
