"""Hardware counters (level set MH): the ncu CSV parser, metric selection, the structural join
onto the G run, the runner's skip without a counter tool, and the analyses (A8, A9, A12, A14,
A15) on the committed H200 measurement (ResNet-50 b64 training with a counter run) and the
committed calibration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xsp.analysis.catalog import COUNTER_KEYS, sections
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables import counters
from xsp.analysis.tables.peaks import datasheet, resolve
from xsp.core import counter_names
from xsp.core.levelset import LevelSet, parse_level_sets
from xsp.tracer.convert import ncu
from xsp.tracer.run import ncu as ncu_run
from xsp.tracer.run.placement import child_spec
from xsp.tracer.run.runner import LeveledSpec, run_leveled
from xsp.tracer.spec import ProfileSpec

ROOT = Path(__file__).resolve().parents[1]
#: ResNet-50 b64 training on the H200: M, MF, MFLG and the counter run MH, recorded by
#: `bash benchmarks/device.sh counters`.
COUNTED = ROOT / "benchmarks/data/r50-b64-train-counters"
#: The same without a counter run.
UNCOUNTED = ROOT / "benchmarks/data/r50-b64-train"
CALIBRATION = ROOT / "benchmarks/results/counter-calibration-h200.json"

# ``ncu --import R --csv --page raw --print-units base`` as Nsight Compute lays it out: a header
# row, a units row whose first cell is empty, one row per kernel; numbers with thousands
# separators; the start/end range cell "<id>:<domain>:<range>:none:...". Written by hand.
RAW_CSV = textwrap.dedent(
    """\
    ==PROF== Connected to process 4242 (/usr/bin/python3.12)
    "ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","device__attribute_display_name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","lts__t_bytes.sum","sm__ops_path_tensor_src_bf16_dst_fp32.sum","sm__sass_thread_inst_executed_op_fadd_pred_on.sum","sm__sass_thread_inst_executed_op_ffma_pred_on.sum","sm__sass_thread_inst_executed_op_fmul_pred_on.sum","sm__warps_active.avg.pct_of_peak_sustained_active"
    "","","","","","","","","","","","","","","Kbyte","byte","usecond","byte","","inst","inst","inst","%"
    "0","4242","python3.12","h200","","3:<default domain>:xsp::step::0:none:none:none:none:none:none","void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","NVIDIA H200","0","4,194,304","2.5","4,194,304","0","0","0","0","87.5"
    "1","4242","python3.12","h200","","3:<default domain>:xsp::step::0:none:none:none:none:none:none","sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","NVIDIA H200","12,582.912","8,388,608","350.25","20,971,520","68,719,476,736","0","16,777,216","0","12.3"
    "2","4242","python3.12","h200","","","void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()>, unsigned int, float, 4>)","1","7","(32, 16, 1)","(80, 1, 1)","0","9.0","NVIDIA H200","8,192","64","n/a","12,288","0","1,000","2,048","24","55.0"
    """
)


def test_the_raw_page_parser_reads_kernels_iterations_and_base_units() -> None:
    parsed = ncu.read_raw_csv(RAW_CSV)
    rows = parsed.table.to_pylist()
    assert [r["iteration"] for r in rows] == [0, 0, -1]  # the last one ran outside every range
    assert [r["ordinal"] for r in rows] == [0, 1, 0]
    assert parsed.outside_iterations == 1 and parsed.iterations_from_ranges
    assert parsed.unreadable_cells == 0  # "n/a" is no number, but no bad cell either
    assert "device__attribute_display_name" not in parsed.table.column_names  # text, no counter
    fill, gemm, reduce = rows
    assert fill["grid"] == "[1024,1,1]" and fill["block"] == "[128,1,1]"
    assert gemm["kernel"].startswith("sm90_xmma_gemm_bf16bf16")
    # bf16 GEMM: 2·M·N·K = 2·4096·4096·2048 = 68,719,476,736 on tensor cores; 16,777,216 FFMAs
    # of its fp32 epilogue (one per output element) are 2 FLOPs each
    assert gemm["flops_bf16"] == 68_719_476_736
    assert gemm["flops_fp32"] == 2 * 16_777_216
    assert gemm["tensor_flops"] == 68_719_476_736
    assert gemm["flops"] == 68_719_476_736 + 33_554_432
    assert gemm["dram_read_bytes"] == 12_582_912  # 12,582.912 Kbyte, decimal prefix
    assert gemm["ncu_duration_ns"] == 350_250  # 350.25 usecond
    assert gemm["occupancy_pct"] == 12.3
    # reduce: fadd 1,000 + fmul 24 + 2 x ffma 2,048 = 5,120 FP32 operations
    assert reduce["flops_fp32"] == 5_120 and reduce["ncu_duration_ns"] is None
    # no fp64 counter was collected: null, not zero
    assert fill["flops_fp64"] is None and fill["flops_fp32"] == 0


def test_without_ranges_a_one_iteration_run_is_iteration_zero() -> None:
    lines = RAW_CSV.splitlines()
    stripped = "\n".join(line.replace("xsp::step::0", "other") for line in lines)
    assert ncu.read_raw_csv(stripped).table.column("iteration").to_pylist() == [-1, -1, -1]
    rows = ncu.read_raw_csv(stripped, iterations=1).table.column("iteration").to_pylist()
    assert rows == [0, 0, 0]


def test_a_csv_without_a_header_is_an_empty_table() -> None:
    parsed = ncu.read_raw_csv("==ERROR== the application returned an error code (1)\n")
    assert parsed.table.num_rows == 0 and "flops" in parsed.table.column_names


def test_metrics_are_chosen_from_what_the_device_offers() -> None:
    everything, missing = ncu.requested_metrics()
    assert missing == [] and "sm__ops_path_tensor_src_bf16_dst_fp32.sum" in everything
    assert len(everything) == len(set(everything))
    # a newer ncu that splits the tensor counters by sparsity and lacks fp8 and fp64 tensor
    offered = {m.split(".")[0] for m in everything} - {
        "sm__ops_path_tensor_src_bf16_dst_fp32",
        "sm__ops_path_tensor_src_fp8",
        "sm__ops_path_tensor_src_fp64",
    }
    offered |= {
        "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off",
        "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_on",
    }
    chosen, missing = ncu.requested_metrics(offered)
    assert "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum" in chosen
    assert "sm__ops_path_tensor_src_bf16_dst_fp32.sum" not in chosen
    assert missing == ["tensor_fp64_ops", "tensor_fp8_ops"]


def test_the_lean_set_leaves_the_throughput_breakdowns_out() -> None:
    from xsp.core import config
    from xsp.core.errors import ConfigError

    lean, _ = ncu.requested_metrics(lean=True)
    full, _ = ncu.requested_metrics()
    assert set(full) - set(lean) == {
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    }
    assert config.counter_set({"XSP_COUNTER_METRICS": "lean"}) == "lean"
    with pytest.raises(ConfigError, match="XSP_COUNTER_METRICS='few'"):
        config.counter_set({"XSP_COUNTER_METRICS": "few"})


def test_query_output_lists_base_metric_names() -> None:
    text = textwrap.dedent(
        """\
        Device NVIDIA H200 (GH100)
        ----------------------------------------------------------------------------
        Metric Name                                  Metric Description
        dram__bytes_read                             # of bytes read from DRAM
        sm__ops_path_tensor_src_bf16_dst_fp32        # of math ops executed in Tensor path
        """
    )
    assert ncu.parse_metric_names(text) == {
        "dram__bytes_read",
        "sm__ops_path_tensor_src_bf16_dst_fp32",
    }


def test_pass_counts_come_from_the_log() -> None:
    log = (
        '==PROF== Profiling "vectorized_elementwise_kernel" - 0: 0%....50%....100% - 9 passes\n'
        '==PROF== Profiling "sm90_xmma_gemm" - 1: 0%....50%....100% - 11 passes\n'
    )
    assert ncu.pass_counts(log) == [9, 11]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("void at::native::f<float>(int, float*)", "at::native::f<float>"),
        ("at::native::f<float>", "at::native::f<float>"),
        ("void k<a::b<(int)1> >(T<int>)", "k<a::b<(int)1>>"),
        ("sm90_xmma_gemm_bf16_kernel", "sm90_xmma_gemm_bf16_kernel"),
    ],
)
def test_kernel_names_key_alike_from_both_tools(name: str, key: str) -> None:
    assert counter_names.kernel_key(name) == key


# (CUPTI's name in the G run, ncu's in the counter run) of kernels of the committed measurement
SPELLINGS = [
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, "
        "float const*, float*)",
        "void engines_precompiled::nchwToNhwcKernel<float, float, float, 0, 1, 0>"
        "(engines_precompiled::nchw2nhwc_params_t<T3>, const T1 *, T2 *)",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
        "void at::vectorized_elementwise_kernel<4, at::CUDAFunctor_add<float>, "
        "std::array<char *, 3>>(int, T2, T3)",
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>"
        "(float*, float const*, int, int, int, bool const*, int, bool)",
        "void <unnamed>::softmax_warp_forward<float, float, float, 10, 1, 0>"
        "(T2 *, const T1 *, int, int, int, const bool *, int, bool)",
    ),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
        "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
        "BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float>(at::native::"
        "(anonymous namespace)::TensorListMetadata<1>, std::multiplies<float>, float)",
        "void at::<unnamed>::multi_tensor_apply_kernel<at::<unnamed>::TensorListMetadata<1>, "
        "at::<unnamed>::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float>"
        "(T1, T2, T3...)",
    ),
    (  # CUPTI left this one mangled
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11thread"
        "block22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi16EEEEEEEEvNT_6ParamsE",
        "void cutlass__5x_cudnn::Kernel<conv::ImplicitGemmConvolution<conv::ImplicitGemm"
        "Multistage<gemm::GemmShape<64, 128, 16>>>>(T1::Params)",
    ),
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32_warpgroupsize2x1x1_execute_"
        "segment_k_off_kernel__5x_cublas",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32_warpgroupsize2x1x1_execute_"
        "segment_k_off_kernel__5x_cublas",
    ),
]


@pytest.mark.parametrize(("cupti", "nsight"), SPELLINGS)
def test_both_tools_spellings_of_a_kernel_share_its_own_function_name(
    cupti: str, nsight: str
) -> None:
    assert counter_names.kernel_base(cupti) == counter_names.kernel_base(nsight)
    assert "::" not in counter_names.kernel_base(cupti) and "<" not in counter_names.kernel_base(
        cupti
    )


def test_counter_kernels_pair_in_launch_order_and_say_what_differs() -> None:
    # the G run launched A B A C in iteration 0; the counter run A A C D: one B missing, one D
    # extra; the second A pairs with the G run's second A though its position differs
    gpu = [{"iteration": 0, "name": f"void ns::{n}<int>(int)"} for n in ("A", "B", "A", "C")]
    counted = [{"iteration": 0, "kernel": n} for n in ("A", "A", "C", "D")]
    alignment = counters.align_kernels(gpu, counted)
    assert alignment.pairs == {0: 0, 2: 1, 3: 2}
    assert alignment.matching.to_pylist() == [
        {
            "iteration": 0,
            "gpu_run_kernels": 4,
            "counter_run_kernels": 4,
            "matched": 3,
            "spelled_differently": 3,  # ns::A<int> against A
            "only_in_gpu_run": 1,
            "only_in_counter_run": 1,
            "first_only_in_gpu_run": "ns::B<int>",
            "first_only_in_counter_run": "D",
        }
    ]


def test_a_kernel_launched_with_another_shape_does_not_pair() -> None:
    gpu = [
        {"iteration": 0, "name": "k", "grid": "[8,1,1]", "block": "[128,1,1]"},
        {"iteration": 0, "name": "k", "grid": "[16,1,1]", "block": "[128,1,1]"},
    ]
    counted = [
        {"iteration": 0, "kernel": "k", "grid": "[16,1,1]", "block": "[128,1,1]"},
    ]
    alignment = counters.align_kernels(gpu, counted)
    assert alignment.pairs == {1: 0}
    # without shapes on one side, the names alone decide
    bare = [{**row, "grid": None} for row in counted]
    assert counters.align_kernels(gpu, bare).pairs == {0: 0}


def test_level_set_mh_stands_alone() -> None:
    assert LevelSet("hm") == "MH" and LevelSet("hm").counters
    assert parse_level_sets("M,MF,MFLG,MH") == ["M", "MF", "MFLG", "MH"]
    for bad in ("MFH", "H", "MHG"):
        with pytest.raises(ValueError, match="runs alone with M"):
            LevelSet(bad)


def test_the_counter_run_measures_its_own_iteration_count(tmp_path: Path) -> None:
    spec = LeveledSpec(
        out=tmp_path,
        profile=ProfileSpec(iterations=10, model="torchvision:resnet18", device="cuda"),
    )
    assert child_spec(spec, LevelSet("MH"), "m").run.profile.iterations == 1
    assert child_spec(spec, LevelSet("MF"), "m").run.profile.iterations == 10


def test_the_child_runs_under_ncu_with_its_report_in_the_run(tmp_path: Path) -> None:
    argv = ncu_run.profile_command("/bin/false", tmp_path, ["python", "-m", "child"])
    assert argv[0] == "/bin/false" and argv[-3:] == ["python", "-m", "child"]
    text = " ".join(argv)
    for flag in ("--target-processes all", "--clock-control none", "--profile-from-start off"):
        assert flag in text
    assert argv[argv.index("--export") + 1] == str(tmp_path / "counters")
    assert "sm__warps_active.avg.pct_of_peak_sustained_active" in argv[argv.index("--metrics") + 1]


MEASURED_SCRIPT = """
    import torch
    import xsp

    for _ in range(3):
        with xsp.iteration():
            torch.ones(4).sum()
"""


def test_without_a_counter_tool_mh_is_skipped_in_one_line_and_the_rest_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XSP_NCU", str(tmp_path / "no-ncu-here"))
    script = tmp_path / "work.py"
    script.write_text(textwrap.dedent(MEASURED_SCRIPT))
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=2, warmup=1, device="cpu", command=(sys.executable, str(script))
        ),
        level_sets=("M", "MH"),
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    assert [run.levels for run in result.runs] == ["M"]
    assert result.skipped == [
        f"level set MH skipped: XSP_NCU={str(tmp_path / 'no-ncu-here')!r} is not an executable"
    ]
    assert [r.getMessage() for r in caplog.records] == [f"xsp: {result.skipped[0]}"]
    manifest = json.loads((spec.out / "manifest.json").read_text())
    assert manifest["skipped"] == [{"levels": "MH", "reason": result.skipped[0]}]
    assert manifest["level_sets"] == ["M"]


def test_peaks_prefer_measured_roofs_and_say_where_each_came_from() -> None:
    name, sheet = datasheet("NVIDIA H200")
    assert name == "H200" and sheet["bf16_tensor"] == 989.4e12 and sheet["dram"] == 4.8e12
    assert datasheet("NVIDIA H100 PCIe")[0] == "H100 PCIe"
    peaks = resolve("NVIDIA H200", {"bf16_tensor": 7.0e14, "dram": 4.0e12, "bogus": 1.0})
    assert peaks.values["bf16_tensor"] == 7.0e14 and peaks.sources["fp32"] == "datasheet"
    assert peaks.ridge("bf16_tensor") == 175.0
    assert "measured on this NVIDIA H200" in peaks.summary and "H200 datasheet" in peaks.summary
    assert resolve("Some GPU", None).summary.startswith("no peaks")


def test_a_measurement_without_counters_says_so_in_one_note() -> None:
    store = MeasurementStore(UNCOUNTED)
    keys = {s.key: s for s in sections(store)}
    assert not set(COUNTER_KEYS) & set(keys)
    note = keys["hardware_counters"]
    assert note.absent and note.table.num_rows == 0
    assert note.note == counters.NO_COUNTERS


def test_the_committed_measurement_holds_counters() -> None:
    manifest = json.loads((COUNTED / "manifest.json").read_text())
    assert {"M", "MF", "MFLG", "MH"} <= {run["levels"] for run in manifest["runs"]}
    meta = json.loads((COUNTED / "MH" / "run.json").read_text())
    assert meta["status"] == "ok" and meta["counters"]["kernels"] > 0
    assert meta["counters"]["iterations_from_nvtx"]


def test_counter_kernels_match_the_gpu_run() -> None:
    store = MeasurementStore(COUNTED)
    # ncu spells 569 of the 737 kernels differently from CUPTI; all pair by launch order
    assert counters.counter_matching(store).to_pylist() == [
        {
            "iteration": 0,
            "gpu_run_kernels": 737,
            "counter_run_kernels": 737,
            "matched": 737,
            "spelled_differently": 569,
            "only_in_gpu_run": 0,
            "only_in_counter_run": 0,
            "first_only_in_gpu_run": None,
            "first_only_in_counter_run": None,
        }
    ]
    note = counters.matching_note(store)
    assert "737 of its 737 kernels matched" in note
    assert (
        "no metric on this device for tensor_fp16_ops (fp16 tensor-core FLOPs count as zero)"
        in note
    )
    assert "lean metric set" in note
    model = counters.model_metrics(store).to_pylist()[0]
    assert model["kernels"] == model["counted_kernels"] == 737
    # ResNet-50 training at batch 64, fp32 with TF32 convolutions (cuDNN's default): about
    # 3 x 8.2 GFLOP per image, 64 images; the counters' sum over the 737 kernels
    assert model["work_gflop"] == pytest.approx(1686.98, abs=0.01)
    assert model["tf32_gflop"] == pytest.approx(1663.35, abs=0.01)
    assert model["fp32_gflop"] == pytest.approx(23.41, abs=0.01)
    assert model["bf16_gflop"] == 0.0 and model["fp64_gflop"] == 0.0
    assert model["tensor_share_pct"] == pytest.approx(98.60, abs=0.01)
    assert model["dram_read_bytes"] + model["dram_write_bytes"] == pytest.approx(63.155e9, rel=1e-4)
    assert model["arithmetic_intensity_flop_per_byte"] == pytest.approx(26.71, abs=0.01)
    assert model["occupancy_pct"] == pytest.approx(44.10, abs=0.01)  # weighted by G-run time
    assert model["precision"] == "tf32 tensor" and model["roof"] == "tf32_tensor"
    # below the TF32 ridge (414.2 TFLOP/s measured / 4.26 TB/s measured = 97.3 FLOP/B)
    assert model["bound"] == "memory-bound"
    assert model["attainable_gflop_per_s"] == pytest.approx(26.71 * 4257.37, rel=1e-3)
    # the lean metric set of this measurement has no throughput metrics
    assert model["sm_throughput_pct"] is None and model["memory_throughput_pct"] is None
    kernels = counters.kernel_info(store)
    assert kernels.num_rows == 737
    assert all(w is not None for w in kernels.column("work_gflop").to_pylist())
    assert counters.layer_metrics(store).num_rows == 142
    assert counters.kernel_roofline(store).num_rows == 554  # the kernels with FLOPs and DRAM


def test_a_kernel_one_run_lacks_shifts_no_other_pair() -> None:
    """The committed runs' kernels, with one kernel dropped from the counter run and another
    from the G run: everything else still pairs with its own counterpart."""
    store = MeasurementStore(COUNTED)
    gpu = [r for r in counters._gpu_kernels(store) if r["iteration"] == 0]
    counted = MeasurementStore(COUNTED).counter_runs[0].counters()
    assert counted is not None
    rows = counted.sort_by("ordinal").to_pylist()
    del rows[100]
    del gpu[400]
    alignment = counters.align_kernels(gpu, rows)
    (row,) = alignment.matching.to_pylist()
    assert row["matched"] == 735
    assert row["only_in_gpu_run"] == row["only_in_counter_run"] == 1
    # each pair holds the same launch: positions shift by one past each dropped kernel
    for g, c in alignment.pairs.items():
        assert (g + (g >= 400)) == (c + (c >= 100))


def test_the_reconstruction_carries_the_counters_on_its_kernels() -> None:
    import pyarrow.compute as pc

    from xsp.analysis.reconstruction.reconstruct import reconstruct

    spans, _ = reconstruct(MeasurementStore(COUNTED))
    kernels = spans.filter(pc.equal(spans.column("kind"), "kernel"))
    assert kernels.num_rows == 5 * 737  # every kernel of the five G iterations is counted
    assert pc.sum(pc.is_valid(kernels.column("hw_flops"))).as_py() == kernels.num_rows
    others = spans.filter(pc.not_equal(spans.column("kind"), "kernel"))
    assert pc.sum(pc.is_valid(others.column("hw_flops"))).as_py() == 0


def test_analyze_json_and_the_report_include_the_counter_analyses(tmp_path: Path) -> None:
    report = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "analyze", str(COUNTED), "--json", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    analyses = json.loads(done.stdout)["analyses"]
    assert set(COUNTER_KEYS) <= set(analyses) and "hardware_counters" not in analyses
    assert analyses["kernel_info"]["rows"] and analyses["model_metrics"]["rows"]
    page = report.read_text()
    assert "Kernel roofline (A9)" in page and "Layer roofline (A14)" in page


def test_the_committed_calibration_counts_gemm_flops_and_copy_bytes() -> None:
    calibration = json.loads(CALIBRATION.read_text())
    cases = {c["case"]: c for c in calibration["cases"]}
    assert cases["gemm_fp32"]["flops_ratio"] == pytest.approx(1.00049, abs=1e-5)
    for case in ("gemm_fp32", "gemm_tf32", "gemm_bf16"):
        assert abs(cases[case]["flops_ratio"] - 1) <= 0.01, cases[case]
    assert cases["gemm_bf16"]["fp32_ffma_per_output"] <= 1.0  # its epilogue only
    assert abs(cases["copy"]["dram_bytes_ratio"] - 1) <= 0.05, cases["copy"]
    assert cases["copy"]["dram_read_ratio"] == pytest.approx(1.0000, abs=1e-4)
    assert cases["copy"]["dram_write_ratio"] == pytest.approx(0.9888, abs=1e-4)
    # fp16 is not measurable on the H200 under this ncu: no fp16 tensor-path metric at all
    assert {"tensor_fp16_ops[0]", "tensor_fp16_ops[1]"} <= set(
        calibration["quantities_without_metric"]
    )
    assert cases["gemm_fp16"]["counted"]["flops"] == 0.0


def test_the_calibration_marks_a_precision_without_a_metric_not_measurable() -> None:
    """The committed calibration's counted totals through the calibration's comparison (the
    file predates the not-measurable verdict, which its ``ok`` false for fp16 stands for)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import counter_calibration as calibrate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    calibration = json.loads(CALIBRATION.read_text())
    rows = []
    for index, case in enumerate(calibration["cases"]):
        outputs = case["expected"].get("outputs", 0)
        rows.append(
            {
                "iteration": index,
                "kernel": case["kernels"][0],
                **case["counted"],
                calibrate.FFMA: case.get("fp32_ffma_per_output", 0.0) * outputs,
            }
        )
    verdicts = {
        c["case"]: c for c in calibrate.compare(rows, calibration["quantities_without_metric"])
    }
    assert [c for c, v in verdicts.items() if v["ok"]] == [
        "gemm_fp32",
        "gemm_tf32",
        "gemm_bf16",
        "copy",
    ]
    assert verdicts["gemm_fp16"]["ok"] is None
    assert "no metric for tensor_fp16_ops" in verdicts["gemm_fp16"]["not_measurable"]
    assert calibrate.compare(rows, [])[3]["ok"] is False  # with a metric, zero would be a failure


def test_a_campaign_adds_the_counter_run_to_the_jobs_it_names(tmp_path: Path) -> None:
    from xsp.campaign.files import from_dict, load
    from xsp.core.errors import ConfigError

    spec = load(ROOT / "campaigns" / "counters.toml")
    assert all(spec.counted(job) for job in spec.jobs()) and len(spec.jobs()) == 8
    assert spec.level_sets_of(spec.jobs()[0]) == ["M", "MFLG", "MH"]
    spec = from_dict(
        {
            "campaign": {"batch_sizes": [1, 64], "level_sets": ["M", "MF"]},
            "models": {"names": ["torchvision:resnet50", "torchvision:vit_b_16"]},
            "counters": {"batch_sizes": [64], "models": ["*resnet*"], "iterations": 2},
        }
    )
    counted = [(j.model, j.batch_size) for j in spec.jobs() if spec.counted(j)]
    assert counted == [("torchvision:resnet50", 64)] and spec.counter_iterations == 2
    with pytest.raises(ConfigError, match=r"unknown \[counters\] keys \['batch'\]"):
        from_dict({"models": {"names": ["x"]}, "counters": {"batch": [64]}})


def test_the_campaign_report_sets_counted_models_on_one_roofline() -> None:
    from xsp.campaign.report import plot_models_roofline
    from xsp.campaign.summary import summarize

    summary = summarize(COUNTED)
    assert summary["counters"]["bound"] in ("compute-bound", "memory-bound")
    record = {
        "model": "torchvision:resnet50",
        "mode": "train",
        "batch_size": 64,
        "summary": summary,
    }
    figure = plot_models_roofline([record], {("torchvision:resnet50", "train"): "ResNet-50"})
    assert "ResNet-50 b64" in figure.to_html(full_html=False, include_plotlyjs=False)
