"""A checkpoint's extra state is unpickled unchecked (NVIDIA/TransformerEngine PR #3123,
"Avoid unpickling the extra state when not needed").

`BasicOperation.set_extra_state` runs `pickle.loads` on the `_extra_state` bytes of a
state dict, so loading a crafted checkpoint into a `te.ops` module runs whatever the
pickle names. The trigger is not a call: a state dict is saved, edited and loaded.

The fix came and went: 2.16.1 refuses such a pickle (`RuntimeError: Refusing to load
pickled Transformer Engine extra state ...` from pytorch/_extra_state.py), 2.17.0 was cut
without it, and 2.17.1 and 2.18.0 on refuse again. A refusal is what "fixed" looks like
here, so the rule declares it as a fixed behaviour, beside our own patch's refusal.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from cases.case import Case
from cases.pipelines import HIDDEN, PIPELINES
from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases
from cases.scenario import Scenario, Steps, Trial, case_generator

if TYPE_CHECKING:  # torch where a case runs: the CLI reads the catalogue without it
    import torch

_EXECUTED: list[str] = []  # what the crafted pickle's payload recorded; emptied after every case


def _payload(tag: str) -> dict[str, Any]:
    """What a crafted checkpoint runs when unpickled: here only a record that it ran."""
    _EXECUTED.append(tag)
    return {}  # an empty state: set_extra_state then returns as if nothing were there


class _Crafted:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_payload, ("payload ran",))


def crafted_extra_state() -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(pickle.dumps(_Crafted())), dtype=torch.uint8)


def _checkpoint(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    if kind == "round_trip":
        return dict(state)
    return {k: crafted_extra_state() if k.endswith("_extra_state") else v for k, v in state.items()}


def _values(case: Case) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The saved module's parameters (not the defaults, so a load that drops them shows) and the
    input, the same on both sides: drawn from the case's own generator."""
    import torch

    g = case_generator(case)
    params = [1 + 0.1 * torch.randn(*shape, generator=g) for _, shape in PIPELINES[case.pipeline].params]
    return params, torch.randn(4, HIDDEN, generator=g)


def _trial(case: Case, target: Any) -> Trial:
    """The target's side: a module saved with the case's parameters, its checkpoint made, loaded
    into a fresh module, which is called."""
    import torch

    pipeline = PIPELINES[case.pipeline]
    build = target.ops["Sequential"]
    saved = build(*pipeline.build(target.ops, {"device": "cpu", "dtype": torch.float32}))
    values, x = _values(case)
    with torch.no_grad():
        for p, value in zip(saved.parameters(), values, strict=True):
            p.copy_(value)
    checkpoint = _checkpoint(saved.state_dict(), case.checkpoint)
    test_observed: dict[str, Any] = {}

    def test() -> tuple[torch.Tensor, ...]:
        module = build(*pipeline.build(target.ops, {"device": "cpu", "dtype": torch.float32}))
        try:
            module.load_state_dict(checkpoint)
        finally:  # also when the load refuses
            test_observed["payload_executed"] = bool(_EXECUTED)
        with torch.no_grad():
            out = module(x.clone())
        return out if isinstance(out, tuple) else (out,)

    return Trial(test=Steps(test, observed=test_observed), cleanup=_EXECUTED.clear)


def _reference(case: Case) -> Steps:
    """Plain PyTorch keeps a module's extra state as data: loading never runs it, and the loaded
    module computes the pipeline's reference with the saved parameters."""
    values, x = _values(case)
    return Steps(lambda: PIPELINES[case.pipeline].reference(x.clone(), (), values),
                 observed={"payload_executed": False})


def _standalone(case: Case, target: str) -> str:
    ops = {"rmsnorm": f"te.ops.RMSNorm({HIDDEN}, device='cpu')",
           "fused_residual_rmsnorm": f"te.ops.MakeExtraOutput(), te.ops.RMSNorm({HIDDEN}, device='cpu')"}[case.pipeline]
    crafted = ("state = {k: torch.frombuffer(bytearray(pickle.dumps(Crafted())), dtype=torch.uint8)\n"
               "         if k.endswith('_extra_state') else v for k, v in state.items()}"
               if case.checkpoint == "crafted_pickle" else "# checkpoint: round_trip, loaded as saved")
    return f'''#!/usr/bin/env python3
"""Reproducer: {case.case_id} (recorded on {target}).

Loads a te.ops module's state dict{' whose _extra_state is a crafted pickle' * (case.checkpoint == 'crafted_pickle')}.
Needs only torch and Transformer Engine; without TE's compiled parts:
    repro exec --target {target} -- python {{this file}}
Exit status 0 when loading runs nothing from the checkpoint (a clear refusal counts as fixed).
"""

import pickle

import torch
import transformer_engine.pytorch as te

RAN = []


def payload(tag):
    RAN.append(tag)
    return {{}}


class Crafted:
    def __reduce__(self):
        return (payload, ("payload ran",))


saved = te.ops.Sequential({ops})
state = saved.state_dict()
{crafted}
loaded = te.ops.Sequential({ops})
try:
    loaded.load_state_dict(state)
except RuntimeError as exc:
    if "Refusing to load pickled" not in str(exc) and "refusing to load global" not in str(exc):
        raise
    print(f"refused: {{exc}}".splitlines()[0])
assert not RAN, "loading the checkpoint ran the pickle's payload"
print("OK: loading the checkpoint ran nothing from it")
'''


STATE_DICT_LOAD = Scenario(
    name="state_dict_load",
    description="a te.ops module's state dict saved, optionally given a crafted _extra_state pickle, and loaded "
    "into a fresh module, which is then called; the reference keeps extra state as data",
    axes={"pipeline": ("rmsnorm", "fused_residual_rmsnorm"), "checkpoint": ("round_trip", "crafted_pickle")},
    trial=_trial,
    reference=_reference,
    standalone=_standalone,
)

_REFUSED = "RuntimeError 'Refusing to load pickled Transformer Engine extra state' from pytorch/_extra_state.py"


def _own_set_extra_state(target: Any) -> str | None:
    if "set_extra_state" not in vars(target.ops["BasicOperation"]):
        return "te.ops.BasicOperation does not define set_extra_state"
    return None


REGRESSION = Regression(
    id="extra_state_pickle",
    title="set_extra_state unpickles a checkpoint's _extra_state unchecked: a crafted state dict runs code",
    upstream="NVIDIA/TransformerEngine PR #3123 (in 2.16.1, lost in 2.17.0, again from 2.17.1)",
    affected=Releases("<2.16.1 || ==2.17.0"),
    patches=("extra_state_refuse_globals",),
    rules=(
        Rule(
            name="crafted_pickle_runs",
            applies=lambda case: case.checkpoint == "crafted_pickle",
            symptom=Symptom("the checkpoint's pickle payload executed while loading the state dict",
                            observed=r"payload_executed: True, reference False"),
            why="set_extra_state calls pickle.loads on the checkpoint's bytes",
            fixed_behaviours=(
                Symptom(_REFUSED, error_type="RuntimeError", message=r"Refusing to load pickled Transformer Engine "
                        r"extra state", frame="transformer_engine/pytorch/_extra_state.py"),
                Symptom("UnpicklingError 'refusing to load global' from ops/op.py (our patch)",
                        error_type="UnpicklingError", message=r"refusing to load global .*_payload",
                        frame="transformer_engine/pytorch/ops/op.py"),
            ),
        ),
    ),
    exclude=lambda case: None,
    presets={
        "default": {"pipeline": ("rmsnorm", "fused_residual_rmsnorm"), "checkpoint": ("round_trip", "crafted_pickle")},
        "sweep": {"pipeline": ("rmsnorm",), "checkpoint": ("round_trip", "crafted_pickle")},
    },
    default_targets=("te-2.17.0", "te-2.17.0+extra_state_refuse_globals", "te-2.16.1", "te-2.17.1"),
    unaffected_reason=lambda case: "a state dict saved by TE itself holds no code",
    scenario=STATE_DICT_LOAD,
    applicable=_own_set_extra_state,
)
