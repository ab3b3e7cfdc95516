"""`repro bench` shapes: the tiny one of the matrix, and a realistic one (2048 tokens x
hidden 4096, bfloat16) that builds the pipeline at that size. Structure only, no timing."""

from __future__ import annotations

import pytest

from cases import pipelines
from harness import bench


def test_realistic_combinations_are_bfloat16_and_skip_matmuls_on_the_cpu() -> None:
    combos = bench.combinations("issue22", None, ["fwd_bwd"])
    realistic = [c for c in combos if c["shape"] == "realistic"]
    assert realistic and {c["dtype"] for c in realistic} == {"bfloat16"}
    assert {c["pipeline"] for c in realistic} == {c["pipeline"] for c in combos if c["shape"] == "tiny"}
    reasons = {c["pipeline"]: bench._static_reason(c, {"cpu": None}) for c in realistic}
    assert reasons["residual_mlp"] and "matmul" in reasons["residual_mlp"]
    assert reasons["rmsnorm"] is None
    # --only dtype=float32 leaves the bfloat16-only shape out
    assert {c["shape"] for c in bench.combinations("issue22", ["dtype=float32"], ["fwd_bwd"])} == {"tiny"}


def test_a_realistic_step_runs_at_that_size(loaded_target, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.bench.worker import make_step

    monkeypatch.setattr(pipelines, "HIDDEN", pipelines.HIDDEN)  # restored after: make_step sets it
    combo = {"pipeline": "rmsnorm", "dtype": "bfloat16", "device": "cpu", "mode": "fwd_bwd", "shape": "realistic"}
    for reference in (False, True):
        step, inputs = make_step(loaded_target, combo, reference)
        assert inputs[0].shape == (2048, 4096) and inputs[0].dtype.is_floating_point
        step()
        assert inputs[0].grad is not None and inputs[0].grad.shape == (2048, 4096)
