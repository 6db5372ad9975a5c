"""How tables read: headers as words with units, numbers as numbers, kernel names shortened, and
a bar per row even when names shorten alike."""

from __future__ import annotations

import pyarrow as pa

from xsp.analysis.figures.charts import bar
from xsp.analysis.figures.present import cell, header, short_kernel


def test_headers_are_words_with_units() -> None:
    assert header("gain_ms_per_iteration") == "Gain (ms/iteration)"
    assert header("share_pct") == "Share (%)"
    assert header("calls_per_iteration") == "Calls per iteration"
    assert header("mean_us") == "Mean (µs)"
    assert header("gpu_busy_ms") == "GPU busy (ms)"
    assert header("module_type") == "Module type"
    assert header("ms_per_iteration") == "Time (ms/iteration)"


def test_numbers_read_as_numbers() -> None:
    assert cell("calls_per_iteration", 20.0) == "20"  # a count, not 20.000
    assert cell("memory_used_bytes", 2_629_697_536.0) == "2.4 GiB"
    assert cell("bytes", 512) == "512 B"
    assert cell("share_pct", 12.345) == "12.3"
    assert cell("mean_ms", 1.23456) == "1.235"
    assert cell("spans", 102_520) == "102,520"
    assert cell("x", None) == "–"


def test_kernel_names_lose_their_template_arguments() -> None:
    name = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
    )
    assert short_kernel(name) == "at::native::vectorized_elementwise_kernel<…>"


def test_kernels_that_shorten_alike_keep_a_bar_each() -> None:
    """Two kernels that differ only in their template arguments: today's 50-character labels
    merged them into one bar."""
    names = [
        f"void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, {n}>(params)" for n in (256, 512)
    ]
    table = pa.table({"kernel": names, "total_ms_per_iteration": [1.0, 2.0]})
    figure = bar(table, "kernel", "total_ms_per_iteration", "t")
    labels = list(figure.data[0].x)
    assert len(set(labels)) == 2
    assert labels == [
        "1. cudnn::bn_fw_tr_1C11_kernel_NCHW<…>",
        "2. cudnn::bn_fw_tr_1C11_kernel_NCHW<…>",
    ]
    assert list(figure.data[0].hovertext) == names
