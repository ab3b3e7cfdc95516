"""Observe one case: run it on a loaded target and on the unfused reference, and compare.

Test and reference tensors are built from the same values (TE's
make_reference_and_test_tensors). The reference runs under the same grad mode and the
same recompute wrapper, so every difference is the fuser's.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cases.axes import INPUTS_REQUIRING_GRAD
from cases.case import Case
from cases.clients import BLOCK_RECOMPUTES, CLIENTS
from cases.deviations import split_known
from cases.pipelines import HIDDEN, PIPELINES
from cases.regressions import REGRESSIONS
from harness.engine import checks, seeding
from harness.engine.frames import error_record
from harness.engine.subject import DTYPES, Subject, import_megatron
from harness.model import Outcome
from harness.targets.loader import LoadedTarget

OUTCOME_OF_CHECK = {
    "completion": Outcome.CRASH, "outputs": Outcome.WRONG_OUTPUT, "output_requires_grad": Outcome.WRONG_OUTPUT,
    "gradients": Outcome.WRONG_GRAD, "caller_tensors": Outcome.SIDE_EFFECT,
    "observations": Outcome.SIDE_EFFECT,  # a regression's own scenario: what its steps observed differs
}


@contextlib.contextmanager
def grad_mode(name: str) -> Iterator[None]:
    if name == "enabled":
        with torch.enable_grad():
            yield
    elif name == "no_grad":
        with torch.no_grad():
            yield
    elif name == "inference_mode":
        with torch.inference_mode():
            yield
    else:  # enable_grad_inside_no_grad
        with torch.no_grad(), torch.enable_grad():
            yield


def wrap(function: Callable[..., Any], recompute: str, device: str) -> Callable[..., Any]:
    if recompute == "none" or recompute in BLOCK_RECOMPUTES:  # a block's own recompute is built into it
        return function
    if recompute == "megatron":
        random = import_megatron(device)
        return lambda *args: random.checkpoint(function, False, *args)
    reentrant = recompute == "checkpoint_reentrant"
    return lambda *args: torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=reentrant)


def make_inputs(case: Case, values: torch.Tensor, residual: torch.Tensor) -> dict[str, torch.Tensor]:
    """The caller's tensors for one input kind: 'x' is what is passed, 'base' the leaf behind it."""
    wants_grad = case.input in INPUTS_REQUIRING_GRAD
    tensors: dict[str, torch.Tensor] = {}
    if case.input == "leaf":
        tensors["x"] = values.clone()
    elif case.input == "leaf_requires_grad":
        tensors["x"] = values.clone().requires_grad_()
    elif case.input == "non_leaf":
        tensors["base"] = (values / 2).requires_grad_()
        tensors["x"] = tensors["base"] * 2
    elif case.input == "view":
        tensors["base"] = values.clone().reshape(-1).requires_grad_()
        tensors["x"] = tensors["base"].view(values.shape)
    else:  # detached
        tensors["base"] = values.clone().requires_grad_()
        tensors["x"] = (tensors["base"] * 1).detach()
    if PIPELINES[case.pipeline].num_extra_inputs:
        tensors["residual"] = residual.clone().requires_grad_(wants_grad)
    return tensors


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _calls(case: Case, function: Callable[..., Any], args: list[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
    """Every call the case makes; the last one is the one backward runs through."""
    if case.sequence == "recompute_pattern":
        with torch.no_grad():
            first = _as_tuple(function(*args))
        return [first, _as_tuple(function(*args))]
    wrapped = wrap(function, case.recompute, case.device)
    with grad_mode(case.grad_mode):
        return [_as_tuple(wrapped(*args))]


def _backward(outputs: tuple[torch.Tensor, ...], weights: list[torch.Tensor], grad_form: str) -> None:
    """A weighted loss gives every output a dense gradient; a plain sum gives each an
    expanded (stride-0) one, as `(y + r).sum()` in a training script does."""
    if grad_form == "expanded":
        loss = sum(o.sum() for o in outputs if o.requires_grad)
    else:
        loss = sum((o.float() * w).sum() for o, w in zip(outputs, weights) if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()


class Side:
    """One side of the comparison: the target's pipeline, or the reference."""

    def __init__(self, case: Case, function: Callable[..., Any], tensors: dict[str, torch.Tensor],
                 params: dict[str, torch.Tensor]) -> None:
        self.case, self.function, self.tensors, self.params = case, function, tensors, params

    def run(self, weights_for: Callable[[tuple[torch.Tensor, ...]], list[torch.Tensor]]) -> None:
        self.before = {n: checks.snapshot(t) for n, t in self.tensors.items()}
        self.after: dict[str, dict[str, Any]] | None = None
        args = [self.tensors["x"]] + ([self.tensors["residual"]] if "residual" in self.tensors else [])
        try:
            self.outputs = _calls(self.case, self.function, args)
            # Values as returned: an in-place op may alias a buffer that a later call changes.
            self.output_values = [tuple(o.detach().clone() for o in call) for call in self.outputs]
            self.after = {n: checks.snapshot(t) for n, t in self.tensors.items()}
            last = self.outputs[-1]
            if any(o.requires_grad for o in last):
                _backward(last, weights_for(last), self.case.grad_form)
        finally:
            # Also when the call raised: a side effect followed by a crash is recorded as both.
            if self.after is None:
                self.after = {n: checks.snapshot(t) for n, t in self.tensors.items()}
        leaves = {n: t for n, t in self.tensors.items() if n != "x" or t.is_leaf}
        self.grads = {n: t.grad for n, t in {**leaves, **self.params}.items()}


def build_module(case: Case, target: LoadedTarget) -> torch.nn.Module:
    kwargs = {"device": case.device, "dtype": DTYPES[case.dtype]}
    return target.ops["Sequential"](*PIPELINES[case.pipeline].build(target.ops, kwargs))


def missing_features(case: Case, target: LoadedTarget) -> list[str]:
    """The op features the case's pipeline needs that the target's release lacks."""
    return [f for f in PIPELINES[case.pipeline].requires if f not in target.features]


def call_not_applicable(case: Case, target: LoadedTarget, spec: str) -> str | None:
    """Why the call scenario cannot build this case on the loaded target (an op or an op
    feature the release lacks, or TE's own module a Megatron client subclasses), or None."""
    from cases.pipelines import ops_used

    if CLIENTS[case.client].uses_megatron and "RMSNorm" not in target.te_modules:
        # Megatron's TEFusedResidualRMSNorm subclasses te.pytorch.RMSNorm, which must run as shipped.
        return f"not applicable on this release: {spec}: TE's own te.pytorch.RMSNorm is not loaded"
    missing = [op for op in target.missing_ops if op in ops_used(PIPELINES[case.pipeline])]
    lacking = missing_features(case, target)
    if missing or lacking:
        return (f"not applicable on this release: {spec} lacks {', '.join(missing + lacking)}"
                + (f" ({target.missing_ops[missing[0]]})" if missing else ""))
    return None


def coverage_gap(case: Case, target: LoadedTarget) -> str | None:
    """Why a not-applicable case may be one the tree should have run: an op it lacks while `te.ops`
    holds BasicOperation subclasses of names upstream never used (the op renamed?), or None."""
    from cases.pipelines import ops_used

    pipeline = case.get("pipeline")
    missing = [op for op in target.missing_ops if op in ops_used(PIPELINES[pipeline])] if pipeline else []
    if not missing or not target.unknown_ops:
        return None
    names = ", ".join(op.partition(":")[2] for op in target.unknown_ops)
    return (f"te.ops lacks {missing[0]} but holds {names}, of no upstream name: if it is {missing[0]} renamed, add"
            f' `[renamed_ops] {missing[0]} = "{target.unknown_ops[0]}"` to the fork config')


def ops_subject(case: Case, target: LoadedTarget) -> Subject:
    """A te.ops pipeline from the catalogue, and its plain-PyTorch reference on cloned parameters."""
    module = build_module(case, target)
    params: dict[str, torch.Tensor] = dict(module.named_parameters())
    for p in params.values():
        p.requires_grad_(case.params == "trainable")
    ref_params = {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in params.items()}
    reference = PIPELINES[case.pipeline].reference
    ordered_ref_params = list(ref_params.values())
    return Subject(module, lambda x, *extra: reference(x, extra, ordered_ref_params), params, ref_params,
                   (4, HIDDEN))


def build_subject(case: Case, target: LoadedTarget, seed: int) -> Subject:
    if case.client == "ops":
        return ops_subject(case, target)
    # Imported here: only the processes that run Megatron cases import Megatron.
    from harness.megatron.cases import megatron_subject

    return megatron_subject(case, target, seed)


def fused_ops_that_ran(module: Any) -> list[str]:
    """The fused ops TE's fuser put in place of basic ops, as `direction:Class` (what TE's own
    tests assert through `_module_groups[0]._forward_ops`); empty when nothing was fused."""
    found = []
    for group in getattr(module, "_module_groups", None) or []:
        for direction in ("forward", "backward"):
            for entry in getattr(group, f"_{direction}_ops", None) or []:
                op = entry[0] if isinstance(entry, tuple) else entry
                if getattr(op, "is_fused_op", False):
                    found.append(f"{direction}:{type(op).__name__}")
    return found


def run_case(case: Case, target: LoadedTarget) -> dict[str, Any]:
    """Observe one case: the fields of its result record, without prediction or verdict."""
    started = time.perf_counter()
    seed = zlib.crc32(case.case_id.split(":", 1)[1].encode())
    seeding.manual_seed(seed)
    dtype = DTYPES[case.dtype]
    subject = build_subject(case, target, seed)
    values = torch.randn(*subject.input_shape, dtype=dtype, device=case.device)
    residual = torch.randn(*subject.input_shape, dtype=dtype, device=case.device)

    weights: list[torch.Tensor] = []

    def weights_for(outputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        while len(weights) < len(outputs):
            weights.append(torch.randn(outputs[len(weights)].shape, device=case.device))
        return weights

    test = Side(case, subject.test, make_inputs(case, values, residual), subject.params)
    ref = Side(case, subject.reference, make_inputs(case, values, residual), subject.reference_params)
    try:
        ref.run(weights_for)
    except Exception as exc:  # noqa: BLE001
        return observation(Outcome.HARNESS_ERROR, {"reference": ["the unfused reference itself failed"]},
                           error_record(exc, None), started, note="the unfused reference itself failed")
    error, error_fields = None, {}
    try:
        test.run(weights_for)
    except Exception as exc:  # noqa: BLE001 — the observation we exist to record
        error, error_fields = error_record(exc, target.te_dir), subject.describe_error(exc)

    failed: dict[str, list[str]] = {}
    assert test.after is not None and ref.after is not None
    if error is None:
        for call, (actual, expected) in enumerate(zip(test.outputs, ref.outputs)):
            label = f"call {call + 1}"
            if f := checks.check_outputs(test.output_values[call], ref.output_values[call], label):
                failed.setdefault("outputs", []).extend(f)
            if f := checks.check_output_requires_grad(actual, expected, label):
                failed.setdefault("output_requires_grad", []).extend(f)
        if f := checks.check_gradients(test.grads, ref.grads):
            failed["gradients"] = f
    if f := checks.check_caller_tensors(test.before, test.after, ref.before, ref.after, flags_only=error is not None):
        failed["caller_tensors"] = f
    record = checked(case, failed, error, started, version=target.prepared.version)
    record["fused_ops"] = fused_ops_that_ran(subject.test)
    record.update(error_fields)
    return record


def checked(case: Case, failed: dict[str, list[str]], error: dict[str, Any] | None, started: float,
            note: str | None = None, version: str = "") -> dict[str, Any]:
    """The observation from the checks' failures: those a known deviation of the case's
    regression explains set apart, a crash first, the outcome from the first failed check."""
    failed, known = split_known(case, REGRESSIONS[case.regression].deviations, failed, version)
    if error is not None:
        failed = {"completion": [f"{error['type']}: {error['message'].splitlines()[0] if error['message'] else ''}"],
                  **failed}
    outcome = next((OUTCOME_OF_CHECK[c] for c in OUTCOME_OF_CHECK if c in failed), Outcome.PASS)
    record = observation(outcome, failed, error, started, note=note)
    record["known_deviations"] = known
    return record


def observation(outcome: Outcome, failed: dict[str, list[str]], error: dict[str, Any] | None, started: float,
                note: str | None = None) -> dict[str, Any]:
    return {
        "outcome": outcome.value, "failed_checks": list(failed), "error": error, "details": failed,
        "side_effects": failed.get("caller_tensors", []), "known_deviations": [], "note": note,
        "duration_s": round(time.perf_counter() - started, 6),
    }
