"""Observe one case on a loaded target, in the worker that imported it: the target's side of the
call (harness.engine.calls), sent raw to the judge (harness.engine.compare), which compares it
with the reference outside this process.

A te.ops pipeline's reference, and Megatron's norm's, are plain PyTorch, computed by the run's
judge from the same values (harness.engine.reference); the parameters of the target's pipeline
are set to those values here. Megatron's block's reference (the same block without recompute)
needs the target, so it runs here too, as a second raw side, which its record names as the
target's (the judge cannot vouch for it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from cases.case import Case
from cases.clients import CLIENTS
from cases.ops.database import needs_process_group
from cases.pipelines import PIPELINES
from harness.engine import calls, compare, seeding, wire
from harness.engine.frames import error_record
from harness.engine.subject import DTYPES, import_megatron
from harness.targets.loader import LoadedTarget

__all__ = ["DTYPES", "build_module", "import_megatron", "observe_case", "run_case"]


def build_module(case: Case, target: LoadedTarget) -> torch.nn.Module:
    kwargs = {"device": case.device, "dtype": DTYPES[case.dtype]}
    single_process_group(case)
    return target.ops["Sequential"](*PIPELINES[case.pipeline].build(target.ops, kwargs))


def single_process_group(case: Case) -> None:
    """torch.distributed's default group, of world size 1 over gloo with an in-process store, for a
    pipeline of TE's communication ops (started once in a worker and kept: TE's ops read it at
    construction)."""
    if not needs_process_group(PIPELINES[case.pipeline].op_keys):
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def unfused_module(case: Case, target: LoadedTarget) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """The case's ops, each in a te.ops.Sequential of its own, so that no fusion pass can fire:
    the second oracle of a generated pipeline (a difference from the fused call is the fuser's).
    Returns the container of its parameters and the call, which routes extra inputs and
    outputs between the groups as one Sequential does."""
    kwargs = {"device": case.device, "dtype": DTYPES[case.dtype]}
    single_process_group(case)
    ops = PIPELINES[case.pipeline].build(target.ops, kwargs)
    groups = [target.ops["Sequential"](op) for op in ops]
    takes = [int(getattr(op, "num_extra_inputs", 0)) for op in ops]

    def call(x: torch.Tensor, *extra: torch.Tensor) -> Any:
        extras, outputs = iter(extra), []
        for group, count in zip(groups, takes):
            result = group(x, *(next(extras) for _ in range(count)))
            x, *more = result if isinstance(result, tuple) else (result,)
            outputs += more
        return (x, *outputs) if outputs else x

    return torch.nn.ModuleList(groups), call


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


def fused_ops_within(roots: tuple[Any, ...]) -> list[str]:
    """The fused ops of every TE fuser inside `roots` (a client's modules): each submodule's own,
    and those of the te.ops.Sequential a module keeps outside its children (TE's
    TEFusedResidualRMSNorm holds its fused pipeline in `_fused_impl`, a one-item tuple)."""
    found = []
    for root in roots:
        for module in root.modules():
            found += fused_ops_that_ran(module)
            for held in getattr(module, "_fused_impl", None) or ():
                found += fused_ops_that_ran(held)
    return found


def set_parameters(case: Case, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The case's values in the module's parameters, named as the pipeline declares them (the
    reference's names); a module whose parameters are not the declared ones cannot be compared."""
    declared = PIPELINES[case.pipeline].params
    found = list(module.parameters())
    if [tuple(p.shape) for p in found] != [shape for _, shape in declared]:
        raise RuntimeError(f"the target's {case.pipeline} holds parameters of shapes "
                           f"{[tuple(p.shape) for p in found]}; the pipeline declares {[s for _, s in declared]}")
    values = calls.parameter_values(case, declared, DTYPES[case.dtype])
    with torch.no_grad():
        for p, value in zip(found, values):
            p.copy_(value)
            p.requires_grad_(case.params == "trainable")
    return {name: p for (name, _), p in zip(declared, found)}


def megatron_checkpoint(case: Case) -> calls.Wrapper | None:
    """Megatron's own activation recompute, for the cases that name it."""
    if case.recompute != "megatron":
        return None
    random = import_megatron(case.device)
    return lambda function: lambda *args: random.checkpoint(function, False, *args)


def observe_case(case: Case, target: LoadedTarget) -> dict[str, Any]:
    """The target's raw observation of one call case: its side (packed), the error that ended it,
    the fused ops that ran; for Megatron's block also the reference's side, run first."""
    from harness.engine.reference import independent

    started = time.perf_counter()
    seed = calls.case_seed(case)
    seeding.manual_seed(seed)  # what TE's and Megatron's constructors draw, the same on every run
    dtype = DTYPES[case.dtype]
    megatron = megatron_checkpoint(case)
    raw: dict[str, Any] = {}
    test: Callable[..., Any]
    describe: Callable[[BaseException], dict[str, Any]] | None
    modules: tuple[Any, ...] = ()
    if case.client == "ops":
        module = build_module(case, target)
        params = set_parameters(case, module)
        shape, test, describe = PIPELINES[case.pipeline].input_shape, module, None
    else:
        from harness.megatron.cases import megatron_subject  # only processes that run Megatron cases import it

        subject = megatron_subject(case, target, seed)
        shape, test, params, describe = subject.input_shape, subject.test, subject.params, subject.describe_error
        modules = subject.modules
        if not independent(case):  # the block's: the judge computes the norm's
            values, residual = calls.input_values(case, shape, dtype)
            reference, ref_error = calls.observe_side(case, subject.reference,
                                                      calls.make_inputs(case, values, residual),
                                                      subject.reference_params, megatron)
            raw["reference"] = {"error": error_record(ref_error, None)} if ref_error else wire.pack(reference)
    if case.client == "ops" and PIPELINES[case.pipeline].generated:
        raw["unfused"] = _unfused_side(case, target, shape, dtype)
    values, residual = calls.input_values(case, shape, dtype)
    side, error = calls.observe_side(case, test, calls.make_inputs(case, values, residual), params, megatron)
    fields: dict[str, Any] = {"fused_ops": fused_ops_within(modules) if modules else fused_ops_that_ran(test)}
    if error is not None and describe is not None:
        fields.update(describe(error))
    raw.update(test=wire.pack(side), error=error_record(error, target.te_dir) if error else None, fields=fields,
               duration_s=round(time.perf_counter() - started, 6))
    return raw


def _unfused_side(case: Case, target: LoadedTarget, shape: Any, dtype: torch.dtype) -> dict[str, Any]:
    """The unfused TE side of a generated case, packed; or {"error": ...} when it failed."""
    container, call = unfused_module(case, target)
    params = set_parameters(case, container)
    values, residual = calls.input_values(case, shape, dtype)
    side, error = calls.observe_side(case, call, calls.make_inputs(case, values, residual), params)
    return {"error": error_record(error, target.te_dir)} if error is not None else wire.pack(side)


def reference_for(case: Case, raw: dict[str, Any]) -> dict[str, Any]:
    """The reference side for a raw observation: plain PyTorch's where it needs no target, else
    the one it brought (Megatron's block)."""
    from harness.engine.reference import independent, reference_side

    return reference_side(case) if independent(case) else raw["reference"]


def run_case(case: Case, target: LoadedTarget) -> dict[str, Any]:
    """Observe and judge one case in this process (tests, benchmarks, `repro show --script`); a run
    judges in the session's controller instead (harness.runner.plugin)."""
    raw = observe_case(case, target)
    return compare.compared(case, wire.unpack(raw), wire.unpack(reference_for(case, raw)), target.prepared.version)
