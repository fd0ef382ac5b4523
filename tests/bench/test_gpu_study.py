"""``bench.gpu_study``: the reading of a compiled GPU program's HLO (on a small module written in the
GPU compiler's text form: a loop of four runs around a causal conv) and the study's conv rewrites,
exact in float32 against the current conv on CPU. About 2 s; no CUDA compiler needed."""

from __future__ import annotations

import pytest

from bench.gpu_study import CATEGORIES, check_variants, executions, markdown, parse_module, study_program

# A while loop (4 trips) whose body concatenates the cache and a frame, convolves them with cuDNN
# (NCDHW: bf012) and transposes the result to channels-last.
HLO = """HloModule jit_run, is_scheduled=true

%fused_concatenate (param_0: bf16[1,8,2,6,6], param_1: bf16[1,8,1,6,6]) -> bf16[1,8,3,6,6] {
  %param_0 = bf16[1,8,2,6,6]{4,3,2,1,0} parameter(0)
  %param_1 = bf16[1,8,1,6,6]{4,3,2,1,0} parameter(1)
  ROOT %concatenate.1 = bf16[1,8,3,6,6]{4,3,2,1,0} concatenate(%param_0, %param_1), dimensions={2}
}

%fused_transpose (param_0.1: bf16[1,8,1,4,4]) -> bf16[1,1,4,4,8] {
  %param_0.1 = bf16[1,8,1,4,4]{4,3,2,1,0} parameter(0)
  ROOT %transpose.1 = bf16[1,1,4,4,8]{4,3,2,1,0} transpose(%param_0.1), dimensions={0,2,3,4,1}
}

%body (arg: (s32[], bf16[1,8,2,6,6], bf16[1,8,1,6,6], bf16[8,8,3,3,3])) -> (s32[], bf16[1,1,4,4,8]) {
  %arg = (s32[], bf16[1,8,2,6,6]{4,3,2,1,0}, bf16[1,8,1,6,6]{4,3,2,1,0}, bf16[8,8,3,3,3]{4,3,2,1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%arg), index=0
  %gte.1 = bf16[1,8,2,6,6]{4,3,2,1,0} get-tuple-element(%arg), index=1
  %gte.2 = bf16[1,8,1,6,6]{4,3,2,1,0} get-tuple-element(%arg), index=2
  %gte.3 = bf16[8,8,3,3,3]{4,3,2,1,0} get-tuple-element(%arg), index=3
  %input_concatenate_fusion = bf16[1,8,3,6,6]{4,3,2,1,0} fusion(%gte.1, %gte.2), kind=kInput, calls=%fused_concatenate, metadata={op_name="jit(run)/decode_step/Block/while/body/conv/CausalConv3d/concatenate"}
  %cudnn-conv.1 = (bf16[1,8,1,4,4]{4,3,2,1,0}, u8[0]{0}) custom-call(%input_concatenate_fusion, %gte.3), window={size=3x3x3}, dim_labels=bf012_oi012->bf012, custom_call_target="__cudnn$convForward", metadata={op_name="jit(run)/decode_step/Block/while/body/conv/CausalConv3d/conv_general_dilated"}
  %gte.4 = bf16[1,8,1,4,4]{4,3,2,1,0} get-tuple-element(%cudnn-conv.1), index=0
  %input_transpose_fusion = bf16[1,1,4,4,8]{4,3,2,1,0} fusion(%gte.4), kind=kInput, calls=%fused_transpose
  ROOT %tuple.1 = (s32[], bf16[1,1,4,4,8]{4,3,2,1,0}) tuple(%gte.0, %input_transpose_fusion)
}

%cond (arg.1: (s32[], bf16[1,8,2,6,6], bf16[1,8,1,6,6], bf16[8,8,3,3,3])) -> pred[] {
  %arg.1 = (s32[], bf16[1,8,2,6,6]{4,3,2,1,0}, bf16[1,8,1,6,6]{4,3,2,1,0}, bf16[8,8,3,3,3]{4,3,2,1,0}) parameter(0)
  ROOT %constant.1 = pred[] constant(true)
}

ENTRY %main (p: (s32[], bf16[1,8,2,6,6], bf16[1,8,1,6,6], bf16[8,8,3,3,3])) -> (s32[], bf16[1,1,4,4,8]) {
  %p = (s32[], bf16[1,8,2,6,6]{4,3,2,1,0}, bf16[1,8,1,6,6]{4,3,2,1,0}, bf16[8,8,3,3,3]{4,3,2,1,0}) parameter(0)
  ROOT %while.1 = (s32[], bf16[1,1,4,4,8]{4,3,2,1,0}) while(%p), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
}
"""


def test_loop_bodies_count_as_often_as_they_run():
    computations, entry = parse_module(HLO)
    assert entry == "main" and executions(computations, entry)["body"] == 4
    # The control: the same module without the trip count runs its body once.
    assert executions(*parse_module(HLO.replace('"n":"4"', '"n":"1"')))["body"] == 1


def test_kernels_are_categorized_with_their_bytes_and_runs():
    study = study_program(HLO)
    assert [(k.category, k.bytes, k.runs) for k in study.kernels] == [
        ("concatenate", 2 * 8 * 36 * (2 + 1 + 3), 4),  # the cache and the frame read, three frames written
        ("conv", 2 * (8 * 3 * 36 + 8 * 8 * 27 + 8 * 16), 4),
        ("layout", 2 * 2 * 8 * 16, 4),
    ]
    (conv,) = study.convs
    assert conv["dim_labels"] == "bf012_oi012->bf012" and conv["target"] == "convForward" and conv["runs"] == 4
    assert conv["flops"] == 2 * (8 * 16) * (8 * 27)  # outputs x multiply-adds each
    assert conv["input_from"] == "input_concatenate_fusion (concatenate)"
    assert conv["kernels_before"] == 1 and conv["bytes_before"] == {"concatenate": 2 * 8 * 36 * 6}
    assert conv["scope"] == "Block/conv/CausalConv3d/conv_general_dilated"
    assert {k.category for k in study.kernels} <= set(CATEGORIES)
    totals = study.totals(1e12, 1e9)
    assert totals["kernels"] == 12 and totals["bytes_by_category"]["layout"] == 4 * 2 * 2 * 8 * 16


def test_the_studied_conv_rewrites_are_exact_in_float32():
    found = check_variants()
    assert found["time-taps-2d"] <= 1e-4 and found["time-in-channels"] <= 1e-4, found
    assert found["control: time taps reversed"] > 1.0, found  # a wrong rewrite is seen
    assert found["edge-select"] == 0.0 and found["control: zero padding"] > 0.1, found  # moved, not computed


@pytest.mark.parametrize("text", ["", "HloModule empty\n"])
def test_a_module_without_kernels_has_none(text):
    assert study_program(text).kernels == []


def test_a_later_step_is_reported_per_output_frame():
    totals = {"kernels": 320, "kernels_by_category": {"conv": 33}, "conv_flops": 1.6e14, "bytes": 3.2e11,
              "bytes_by_category": {}, "conv_floor_s": 0.16, "memory_floor_s": 0.096}
    step = {"frames": 16, "memory": {"temp_bytes": 11.4e9}, "totals": totals, "convs": []}
    result = {"variant": "chunk-4", "dtype": "bfloat16", "geometry": {"chunk": 4, "inner_frames": 16},
              "programs": {"later step": step}}
    text = markdown([result], "python -m bench.gpu_study", "a host")
    # 16 frames a step: 320 kernels, 320 GB, 160 ms and 96 ms a step are 20, 20.0, 10.0 and 6.0 a frame.
    assert "| chunk-4 | bfloat16 | 4 | 16 | 16 | 20 | 20.0 | 10.0 | 6.0 | 11.4 |" in text
