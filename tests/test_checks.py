"""Each check catches what it exists for: deliberately broken CPU ops, run through the
real te-2.20.2 fuser, give the outcome that check owns."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cases.case import Case
from harness.engine.execute import run_case


def _case(**axes: str) -> Case:
    base = {"regression": "issue22", "client": "ops", "pipeline": "fused_residual_rmsnorm", "grad_mode": "enabled",
            "input": "non_leaf", "params": "trainable", "recompute": "none", "sequence": "single",
            "grad_form": "dense", "dtype": "float32", "device": "cpu"}
    return Case(**{**base, **axes})


def _with_rmsnorm(target, broken: type):
    return dataclasses.replace(target, ops={**target.ops, "RMSNorm": broken})


def test_sound_op_passes(loaded_target) -> None:
    assert run_case(_case(), loaded_target)["outcome"] == "pass"


def test_wrong_values_are_caught(loaded_target) -> None:
    class WrongValues(loaded_target.ops["RMSNorm"]):
        def op_forward(self, ctx, input_, **kwargs):  # TE's own op
            return super().op_forward(ctx, input_, **kwargs) + 0.5

    record = run_case(_case(), _with_rmsnorm(loaded_target, WrongValues))
    assert record["outcome"] == "wrong_output" and "outputs" in record["failed_checks"]


def test_dropped_gradient_is_caught(loaded_target) -> None:
    class DropsGrad(loaded_target.ops["RMSNorm"]):
        def op_backward(self, ctx, grad_output):
            grad_input, _ = super().op_backward(ctx, grad_output)
            return grad_input, [None]

    # A lone RMSNorm: behind MakeExtraOutput TE's fusion pass runs BackwardAddRMSNorm instead of op_backward.
    record = run_case(_case(pipeline="rmsnorm"), _with_rmsnorm(loaded_target, DropsGrad))
    assert record["outcome"] == "wrong_grad"
    assert any("grad of 0.weight" in d for d in record["details"]["gradients"]), record["details"]


def test_flipped_caller_requires_grad_is_caught(loaded_target) -> None:
    class FlipsCaller(loaded_target.ops["RMSNorm"]):
        def op_forward(self, ctx, input_, **kwargs):
            input_.requires_grad_(False)  # the caller's leaf, handed through by the fuser
            return super().op_forward(ctx, input_, **kwargs)

    record = run_case(_case(pipeline="rmsnorm", grad_mode="no_grad", input="leaf_requires_grad"),
                      _with_rmsnorm(loaded_target, FlipsCaller))
    assert record["outcome"] == "side_effect"
    assert any("requires_grad" in d for d in record["details"]["caller_tensors"])


def test_side_effect_then_crash_records_both(loaded_target) -> None:
    class FlipsThenRaises(loaded_target.ops["RMSNorm"]):
        def op_forward(self, ctx, input_, **kwargs):
            input_.requires_grad_(False)
            raise ValueError("deliberate, after the side effect")

    record = run_case(_case(pipeline="rmsnorm", grad_mode="no_grad", input="leaf_requires_grad"),
                      _with_rmsnorm(loaded_target, FlipsThenRaises))
    assert record["outcome"] == "crash" and record["error"]["type"] == "ValueError"
    assert record["side_effects"] == ["caller's x.requires_grad: True -> False, reference -> True"]


def test_raising_op_is_a_crash_with_te_location(loaded_target) -> None:
    class Raises(loaded_target.ops["RMSNorm"]):
        def op_forward(self, ctx, input_, **kwargs):
            raise ValueError("deliberate")

    record = run_case(_case(), _with_rmsnorm(loaded_target, Raises))
    assert record["outcome"] == "crash"
    assert record["error"]["type"] == "ValueError"
    assert record["error"]["location"].startswith("transformer_engine/pytorch/ops/")


@pytest.mark.parametrize("recompute", ["checkpoint_reentrant", "checkpoint_non_reentrant", "megatron"])
def test_recompute_wrappers_run_backward(loaded_target, recompute: str) -> None:
    record = run_case(_case(recompute=recompute), loaded_target)
    assert record["outcome"] == "pass", record


def test_megatron_wrapper_is_megatrons_own_class() -> None:
    from harness.engine.execute import import_megatron

    random = import_megatron("cpu")
    assert random.CheckpointFunction.__module__ == "megatron.core.tensor_parallel.random"
    assert torch.is_tensor(random._get_cuda_rng_state())


def test_a_case_in_low_precision_bounds_its_float32_tensors() -> None:
    """A float32 gradient in a bfloat16 case carries bfloat16's rounding: compared at bfloat16's tolerance
    (a fused kernel that rounds once where the unfused path rounds twice is no bug), while a wrong value
    still fails, and a float32 case keeps float32's tolerance."""
    from harness.engine.checks import check_gradients

    expected = {"w": torch.full((8,), 0.04)}
    rounded = {"w": expected["w"] + 2.4e-5}  # what the fused rmsnorm_bwd_add's single rounding moved it by
    assert check_gradients(rounded, expected, torch.bfloat16) == []
    assert check_gradients(rounded, expected, torch.float32) != []
    assert check_gradients(rounded, expected) != []
    assert check_gradients({"w": expected["w"] * 1.5}, expected, torch.bfloat16) != []


def test_a_gradient_is_as_exact_as_the_gradients_it_is_made_of() -> None:
    """bfloat16: an element that cancels to near zero may be off by a rounding of the largest
    upstream gradient (a fused kernel rounds once where the unfused path rounds twice); an error
    of the terms' own size is still caught."""
    from harness.engine.checks import check_gradients

    expected = {"w": torch.tensor([[12.0, 0.01], [3.0, -5.0]], dtype=torch.bfloat16), "b": torch.ones(2, dtype=torch.bfloat16)}
    one_ulp = {**expected, "w": expected["w"] + torch.tensor([[0.0, 0.0625], [0.0, 0.0]], dtype=torch.bfloat16)}
    assert check_gradients(one_ulp, expected, torch.bfloat16) == []
    wrong = {**expected, "w": expected["w"] + torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.bfloat16)}
    [failure] = check_gradients(wrong, expected, torch.bfloat16)
    assert failure.startswith("grad of w: Tensor-likes are not close!") and "Greatest absolute difference: 0.99" in failure
