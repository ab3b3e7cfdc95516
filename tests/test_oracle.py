"""The issue-22 oracle rule and the verdict table."""

from __future__ import annotations

import pytest

from cases import issue22
from cases.matrix import Case, generate, parse_filters, skip_reason
from harness.errors import UsageError


def _case(**axes: str) -> Case:
    base = {"pipeline": "fused_residual_rmsnorm", "grad_mode": "no_grad", "input": "non_leaf",
            "params": "trainable", "recompute": "none", "sequence": "single", "dtype": "float32", "device": "cpu"}
    return Case(**{**base, **axes})


@pytest.mark.parametrize(
    "axes, expected, effect",
    [
        ({}, "affected", "crash"),
        ({"input": "view"}, "affected", "crash"),
        ({"input": "leaf_requires_grad"}, "affected", "side_effect"),
        ({"input": "leaf"}, "unaffected", None),
        ({"input": "detached"}, "unaffected", None),
        ({"grad_mode": "enabled"}, "unaffected", None),
        ({"grad_mode": "enable_grad_inside_no_grad"}, "unaffected", None),
        ({"grad_mode": "inference_mode"}, "affected", "crash"),
        ({"grad_mode": "enabled", "recompute": "megatron"}, "affected", "crash"),
        ({"grad_mode": "enabled", "recompute": "checkpoint_reentrant"}, "affected", "crash"),
        ({"grad_mode": "enabled", "recompute": "checkpoint_non_reentrant"}, "unaffected", None),
        ({"grad_mode": "enabled", "sequence": "recompute_pattern"}, "affected", "crash"),
        ({"pipeline": "rmsnorm"}, "unaffected", None),
        ({"pipeline": "add_residual_rmsnorm"}, "unaffected", None),
        ({"pipeline": "identity"}, "affected", "crash"),
    ],
)
def test_predict(axes: dict[str, str], expected: str, effect: str | None) -> None:
    prediction = issue22.predict(_case(**axes))
    assert (prediction.expected, prediction.effect) == (expected, effect)


@pytest.mark.parametrize(
    "expected, outcome, has_fix, verdict",
    [
        ("affected", "crash", False, "reproduced"),
        ("affected", "pass", False, "unexpected_pass"),
        ("affected", "pass", True, "fixed"),
        ("affected", "crash", True, "regression"),
        ("unaffected", "pass", False, "unaffected"),
        ("unaffected", "wrong_grad", True, "regression"),
        ("unaffected", "skipped", True, "skipped"),
        ("affected", "harness_error", False, "harness_error"),
    ],
)
def test_verdict(expected: str, outcome: str, has_fix: bool, verdict: str) -> None:
    assert issue22.verdict(expected, outcome, has_fix) == verdict


def test_matrix_is_whole_and_skips_have_reasons() -> None:
    cases = generate("issue22")
    assert len({c.case_id for c in cases}) == len(cases)
    assert skip_reason(_case(grad_mode="inference_mode", recompute="megatron"))
    assert skip_reason(_case()) is None


def test_filters_are_checked() -> None:
    assert parse_filters(["input=leaf,view"]) == {"input": ("leaf", "view")}
    with pytest.raises(UsageError, match="valid: leaf"):
        parse_filters(["input=nope"])
    with pytest.raises(UsageError, match="above the cap"):
        generate("full", max_cases=10)
