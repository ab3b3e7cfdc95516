"""A case's reference side, computed where no target was ever imported: by the run's judge
(harness.runner.observations), once per case for every target, from the same values as the
target's side (each random value of a case comes from a generator seeded by its id). A reference
side a worker sends for such a case is never used: it may be the target's own choice.

- a te.ops call case: the pipeline's plain-PyTorch reference;
- a scenario's own trial: the scenario's `reference` steps, built from the case alone
  (cases/scenario.py);
- a megatron_norm case: plain torch's RMSNorm with the case's weight (harness.megatron.norm_reference).

The one case whose reference is TE itself, Megatron's block without recompute, runs it in the
target's worker (building Megatron's block needs the TE that Megatron imports); its comparison is
still the judge's, and its record says the judge cannot vouch for that reference (REFERENCE_FROM_TARGET).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regressions import REGRESSIONS
from harness.engine import calls, trial, wire
from harness.engine.frames import error_record
from harness.engine.subject import DTYPES

# Said in the record of a case whose reference side came from the target's own worker.
REFERENCE_FROM_TARGET = ("the target's worker: Megatron's block without recompute is built on the target's TE, "
                         "so the judge cannot vouch for this reference")
JUDGED_CLIENTS = ("ops", "megatron_norm")  # the call scenario's clients whose reference needs no target


def independent(case: Case) -> bool:
    """Whether the case's reference needs no target, so the judge computes it: a scenario's own
    trial, or the call scenario on a te.ops pipeline or Megatron's norm."""
    return REGRESSIONS[case.regression].scenario.trial is not None or case.client in JUDGED_CLIENTS


def parameters(case: Case) -> dict[str, torch.Tensor]:
    """The pipeline's parameters with the case's values, by the pipeline's own names."""
    pipeline = PIPELINES[case.pipeline]
    values = calls.parameter_values(case, pipeline.params, DTYPES[case.dtype])
    return {name: v.requires_grad_(case.params == "trainable") for (name, _), v in zip(pipeline.params, values)}


def reference_side(case: Case) -> dict[str, Any]:
    """The reference's side of one case whose reference needs no target, packed; or {"error": ...}
    when it failed itself."""
    scenario = REGRESSIONS[case.regression].scenario
    if scenario.trial is not None:
        return trial.reference_side(case, scenario)
    if case.client == "megatron_norm":
        return _megatron_norm_side(case)
    pipeline = PIPELINES[case.pipeline]
    params = parameters(case)
    ordered = list(params.values())
    return _call_side(case, lambda x, *extra: pipeline.reference(x, extra, ordered), pipeline.input_shape, params)


def _megatron_norm_side(case: Case) -> dict[str, Any]:
    """Megatron's TENorm(has_residual=True) in plain torch, under the case's recompute in plain
    PyTorch's semantics (calls.wrap), from the weight and inputs the target's worker uses."""
    from harness.megatron.norm_reference import INPUT_SHAPE, norm_reference, norm_weight

    weight = norm_weight(calls.case_seed(case), DTYPES[case.dtype], case.device)
    weight.requires_grad_(case.params == "trainable")
    return _call_side(case, norm_reference(weight), INPUT_SHAPE, {"weight": weight})


def _call_side(case: Case, function: Any, shape: tuple[int, ...], params: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One call case's reference side from the case's inputs, packed; or {"error": ...}."""
    values, residual = calls.input_values(case, shape, DTYPES[case.dtype])
    with warnings.catch_warnings():  # a case that recomputes inputs needing no grad, on purpose: not news on the terminal
        warnings.filterwarnings("ignore", "None of the inputs have requires_grad=True", UserWarning)
        side, error = calls.observe_side(case, function, calls.make_inputs(case, values, residual), params)
    return {"error": error_record(error, None)} if error is not None else wire.pack(side)
