"""The record names the fused ops TE's own fusion passes put in place (as TE's tests check
`_module_groups[0]._forward_ops`), read off the fuser that ran, on te-2.20.2."""

from __future__ import annotations

import sys

import pytest

from cases.case import Case
from harness.engine.execute import run_case


def _case(pipeline: str, dtype: str) -> Case:
    return Case(regression="issue22", client="ops", pipeline=pipeline, grad_mode="enabled", input="non_leaf",
                params="trainable", recompute="none", sequence="single", grad_form="dense", dtype=dtype, device="cpu")


@pytest.mark.parametrize("pipeline, dtype, fused", [
    # TE fuses BasicLinear+Bias in its forward only for 16-bit weights.
    ("linear_bias_extra", "bfloat16", ["forward:ForwardLinearBiasActivation"]),
    ("linear_bias_extra", "float32", []),
    # MakeExtraOutput's gradient added into RMSNorm's backward.
    ("fused_residual_rmsnorm", "float32", ["backward:BackwardAddRMSNorm"]),
    ("rmsnorm", "float32", []),
])
def test_record_names_the_fused_ops_that_ran(loaded_target, pipeline: str, dtype: str, fused: list[str]) -> None:
    record = run_case(_case(pipeline, dtype), loaded_target)
    assert record["outcome"] == "pass", record["details"]
    assert record["fused_ops"] == fused


@pytest.mark.parametrize("client", ["megatron_norm", "megatron_block"])
def test_megatron_cases_name_the_fused_ops_that_ran(loaded_target, client: str) -> None:
    """Megatron's TEFusedResidualRMSNorm keeps TE's fused pipeline outside its children: the record still
    reads it (one BackwardAddRMSNorm per norm that ran; the block has two layers, the reference none)."""
    case = Case(regression="issue22", client=client, pipeline="fused_residual_rmsnorm", grad_mode="enabled",
                input="non_leaf", params="trainable", recompute="none", sequence="single", grad_form="dense",
                dtype="float32", device="cpu")
    record = run_case(case, loaded_target)
    assert record["outcome"] == "pass", record["details"]
    assert record["fused_ops"] == ["backward:BackwardAddRMSNorm"] * (2 if client == "megatron_block" else 1)


def test_fused_ops_come_from_tes_own_fusion_passes(loaded_target, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TE's own registered passes emptied, the record says nothing was fused: it reads the fuser."""
    fuser = sys.modules["transformer_engine.pytorch.ops.fuser"].OperationFuser
    for registry in ("forward_backward_fusion_functions", "forward_fusion_functions", "backward_fusion_functions"):
        monkeypatch.setattr(fuser, registry, [])
    record = run_case(_case("fused_residual_rmsnorm", "float32"), loaded_target)
    assert record["outcome"] == "pass", record["details"]
    assert record["fused_ops"] == []
