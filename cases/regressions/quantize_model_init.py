"""An op constructed under quantized_model_init fails before it is built
(NVIDIA/TransformerEngine PR #2421, "Avoid initializing recipe state in fusible op base
class constructor").

From 2.7.0, `BasicOperation.__init__` resets the quantization recipe state when it runs
under `quantized_model_init` (`fp8_model_init` before 2.9). That asks the op for its
quantizer count before the subclass's own `__init__` has set its attributes: `te.ops.Quantize`
reads `self._quantize_forward` in `num_quantizers`, so constructing it there raises
AttributeError. The trigger is not a call: it is an op built under a recipe. 2.10.0 moved
the reset into BasicLinear's constructor.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from cases.case import Case
from cases.pipelines import HIDDEN
from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases
from cases.scenario import Scenario, Steps, Trial, case_generator

if TYPE_CHECKING:  # torch where a case runs: the CLI reads the catalogue without it
    import torch

OPS = {"quantize": "Quantize", "identity": "Identity"}  # Identity reads no attribute of its own: the control


def _model_init(te: Any) -> Any:
    """quantized_model_init (2.9 on), else its older name fp8_model_init."""
    return getattr(te, "quantized_model_init", None) or getattr(te, "fp8_model_init", None)


def _op_class(case: Case, target: Any) -> Any:
    """TE's own op class, as the package exports it (te.ops), else as the loader found it."""
    te_ops = getattr(importlib.import_module("transformer_engine.pytorch"), "ops", None)
    return getattr(te_ops, OPS[case.op], None) or target.ops.get(OPS[case.op])


def _trial(case: Case, target: Any) -> Trial:
    import torch

    te = importlib.import_module("transformer_engine.pytorch")
    op_class = _op_class(case, target)
    recipe = importlib.import_module("transformer_engine.common.recipe").DelayedScaling()
    x = _input(case)

    def test() -> tuple[torch.Tensor, ...]:
        scope = (_model_init(te)(enabled=True, recipe=recipe) if case.init == "model_init"
                 else contextlib.nullcontext())
        with scope:
            op = op_class()
        with torch.no_grad():  # outside an autocast Quantize passes its input through
            return (target.ops["Sequential"](op)(x.clone()),)

    return Trial(test=Steps(test))


def _input(case: Case) -> torch.Tensor:
    import torch

    return torch.randn(4, HIDDEN, generator=case_generator(case))


def _reference(case: Case) -> Steps:
    """Outside an autocast an op built whole passes its input through."""
    x = _input(case)
    return Steps(lambda: (x.clone(),))


def _applicable(case: Case, target: Any) -> str | None:
    try:
        if _op_class(case, target) is None:
            return f"te.ops has no {OPS[case.op]}"
        found = _model_init(importlib.import_module("transformer_engine.pytorch"))
    except Exception as exc:  # noqa: BLE001 — a loader that stands in the quantization modules says why
        return f"quantized_model_init cannot be reached on this target: {type(exc).__name__}: {exc}"
    return None if found is not None else "te.pytorch has neither quantized_model_init nor fp8_model_init"


CONSTRUCT_UNDER_RECIPE = Scenario(
    name="construct_under_recipe",
    description="a te.ops op constructed inside quantized_model_init(enabled=True, recipe=DelayedScaling()) "
    "(or outside it: the control), then called outside any autocast; the reference passes the input through",
    axes={"op": ("quantize", "identity"), "init": ("none", "model_init")},
    trial=_trial,
    reference=_reference,
    applicable=_applicable,
)

REGRESSION = Regression(
    id="quantize_model_init",
    title="BasicOperation.__init__ resets recipe state under quantized_model_init before a subclass set its attributes",
    upstream="NVIDIA/TransformerEngine PR #2421",
    affected=Releases(">=2.7.0,<2.10.0"),
    patches=("quantize_attrs_first",),
    rules=(
        Rule(
            name="quantize_unbuilt_under_model_init",
            applies=lambda case: case.op == "quantize" and case.init == "model_init",
            symptom=Symptom("AttributeError '_quantize_forward' while constructing te.ops.Quantize",
                            error_type="AttributeError", message=r"_quantize_forward",
                            frame="transformer_engine/pytorch/ops/basic/quantize.py"),
            why="BasicOperation.__init__ calls reset_recipe_state, which asks num_quantizers before "
            "Quantize.__init__ has set _quantize_forward",
        ),
    ),
    exclude=lambda case: None,
    presets={"default": {"op": ("quantize", "identity"), "init": ("none", "model_init")},
             "sweep": {"op": ("quantize",), "init": ("none", "model_init")}},
    default_targets=("te-2.9.0", "te-2.9.0+quantize_attrs_first", "te-2.10.0"),
    unaffected_reason=lambda case: ("outside quantized_model_init no recipe state is reset" if case.init == "none"
                                    else f"{OPS[case.op]} reads no attribute of its own when asked for quantizers"),
    scenario=CONSTRUCT_UNDER_RECIPE,
)
