"""The plain-PyTorch reference of a te.ops call case, computed where no target was ever imported:
by the run's judge (harness.runner.observations), once per case for every target, from the same
values as the target's side (each random value of a case comes from a generator seeded by its id).

The cases whose reference is TE itself (Megatron's block without recompute) or whose steps a
regression builds beside the target's (a scenario's own trial) run their reference in the
target's worker; their comparison is still the judge's.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regressions import REGRESSIONS
from harness.engine import calls, wire
from harness.engine.frames import error_record
from harness.engine.subject import DTYPES


def independent(case: Case) -> bool:
    """Whether the case's reference is plain PyTorch that needs no target: the call scenario on a
    te.ops pipeline."""
    return REGRESSIONS[case.regression].scenario.trial is None and case.client == "ops"


def parameters(case: Case) -> dict[str, torch.Tensor]:
    """The pipeline's parameters with the case's values, by the pipeline's own names."""
    pipeline = PIPELINES[case.pipeline]
    values = calls.parameter_values(case, pipeline.params, DTYPES[case.dtype])
    return {name: v.requires_grad_(case.params == "trainable") for (name, _), v in zip(pipeline.params, values)}


def reference_side(case: Case) -> dict[str, Any]:
    """The reference's side of one call case, packed; or {"error": ...} when it failed itself."""
    pipeline = PIPELINES[case.pipeline]
    params = parameters(case)
    ordered = list(params.values())
    values, residual = calls.input_values(case, pipeline.input_shape, DTYPES[case.dtype])
    with warnings.catch_warnings():  # a case that recomputes inputs needing no grad, on purpose: not news on the terminal
        warnings.filterwarnings("ignore", "None of the inputs have requires_grad=True", UserWarning)
        side, error = calls.observe_side(case, lambda x, *extra: pipeline.reference(x, extra, ordered),
                                         calls.make_inputs(case, values, residual), params)
    return {"error": error_record(error, None)} if error is not None else wire.pack(side)
