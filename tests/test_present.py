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
        "cudnn::bn_fw_tr_1C11_kernel_NCHW<…, 256>",
        "cudnn::bn_fw_tr_1C11_kernel_NCHW<…, 512>",
    ]
    assert list(figure.data[0].hovertext) == names


def test_kernels_that_read_alike_keep_the_template_arguments_that_tell_them_apart() -> None:
    """ResNet-50's kernels table listed cudnn::bn_bw_1C11_kernel_new<…> three times, told apart
    only on hover: they differ in their fourth template argument."""
    from xsp.analysis.figures.present import distinct_kernels

    params = "(float, float, cudnnTensorStruct, float const*)"
    names = [
        f"void cudnn::bn_bw_1C11_kernel_new<float, float, float2, {n}, true, 1>{params}"
        for n in (128, 32, 512, 128)  # the last: the first kernel again (another layer's row)
    ]
    names.append("void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, 0>(args)")
    assert distinct_kernels(names) == [
        "cudnn::bn_bw_1C11_kernel_new<…, 128, …>",
        "cudnn::bn_bw_1C11_kernel_new<…, 32, …>",
        "cudnn::bn_bw_1C11_kernel_new<…, 512, …>",
        "cudnn::bn_bw_1C11_kernel_new<…, 128, …>",
        "cudnn::bn_bw_1C11_singleread<…>",
    ]
    # the same template arguments, other parameters: numbered
    twins = ["void k<4>(int)", "void k<4>(long)"]
    assert distinct_kernels(twins) == ["k<…> #1", "k<…> #2"]
    # long arguments (r50's kernels): by their own name, the value of a cast, or the words
    # where they differ; commas inside a lambda's signature do not split an argument
    functors = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "std::array<char*, 3ul> >(int)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, "
        "float, float, at::native::(anonymous namespace)::threshold_kernel_impl<float>("
        "at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}>, std::array<char*, "
        "3ul> >(int)",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, false, "
        "(cudnnKernelDataType_t)0>(float*)",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, false, "
        "(cudnnKernelDataType_t)2>(float*)",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>(Params)",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nt_align4>(Params)",
    ]
    assert distinct_kernels(functors) == [
        "at::native::vectorized_elementwise_kernel<…, CUDAFunctor_add<…>, …>",
        "at::native::vectorized_elementwise_kernel<…, BinaryFunctor<…>, …>",
        "cudnn::engines_precompiled::nchwToNhwcKernel<…, 0>",
        "cudnn::engines_precompiled::nchwToNhwcKernel<…, 2>",
        "cutlass::Kernel2<…_tn_…>",
        "cutlass::Kernel2<…_nt_…>",
    ]
    # a label does not depend on the rows' order: one long argument once dropped the word
    # that told the next one apart (``…_dd_…`` for ``…_dd_y2``)
    long_and_short = [
        "void k<aaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb_x1>(int)",
        "void k<aaaa_dd_y2>(int)",
    ]
    assert distinct_kernels(long_and_short)[1] == "k<…_dd_y2>"
    assert distinct_kernels(long_and_short[::-1])[0] == "k<…_dd_y2>"
    table = pa.table({"kernel": names[:3], "total_ms_per_iteration": [3.0, 2.0, 1.0]})
    labels = list(bar(table, "kernel", "total_ms_per_iteration", "t").data[0].x)
    assert labels[1] == "cudnn::bn_bw_1C11_kernel_new<…, 32, …>"


def test_sizes_carry_their_unit_in_the_cell_not_the_header() -> None:
    """A "Memory used (bytes)" column held "7.9 GiB"; a bytes axis read "1B" (a billion)."""
    assert header("memory_used_bytes") == "Memory used"
    assert header("allocated_bytes_per_iteration") == "Allocated (per iteration)"
    assert cell("memory_used_bytes", 7.9 * 2**30) == "7.9 GiB"
    table = pa.table({"layer": ["a", "b"], "allocated_bytes_per_iteration": [3 * 2**30, 2**29]})
    figure = bar(table, "layer", "allocated_bytes_per_iteration", "t")
    assert figure.layout.yaxis.title.text == "Allocated (GiB/iteration)"
    assert list(figure.data[0].y) == [3.0, 0.5]
    small = bar(pa.table({"layer": ["a"], "held_bytes": [3 * 2**20]}), "layer", "held_bytes", "t")
    assert (small.layout.yaxis.title.text, list(small.data[0].y)) == ("Held (MiB)", [3.0])


def test_memory_devices_read_as_people_name_them() -> None:
    from xsp.analysis.tables.memory_timeline import device_name

    assert device_name("cpu", -1) == "CPU"  # was "cpu:-1"
    assert device_name("cuda", 1) == "GPU 1"
    assert device_name("xpu", 0) == "xpu:0"
