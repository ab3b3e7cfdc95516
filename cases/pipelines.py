"""The pipeline catalogue. Each entry is data, in the style of PyTorch's ModuleInfo: how
to build it from a target's ops, and a plain-PyTorch reference of the same computation.

The structural facts the regressions' rules read are declared here: whether some fuser
group hands its input tensor back unchanged (`exposes_input`: MakeExtraOutput's extra
output, Identity's output), how many basic ops each fuser group holds, and which op
features a release must have for the pipeline to mean what its reference says.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cases.ops.generated import GENERATED, keys_of, pipeline_of, valid
from cases.ops.references import add_in_place, gelu, layer_norm, rms_norm
from cases.pipeline_info import HIDDEN, PipelineInfo, Tensors, ops_used

# torch only where a pipeline is built or computed: every `repro` command reads this catalogue,
# and importing torch costs it two seconds.
if TYPE_CHECKING:
    import torch

__all__ = ["HIDDEN", "PIPELINES", "PipelineInfo", "Tensors", "layer_norm", "ops_used", "rms_norm"]


@functools.cache
def _tanh_class() -> type:
    import torch

    class Tanh(torch.nn.Module):
        """A plain torch module: it splits a te.ops.Sequential into two fuser groups."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x)

    Tanh.__module__ = __name__
    return Tanh


def __getattr__(name: str) -> Any:
    """`pipelines.Tanh`, the class, made on first use (it needs torch)."""
    if name == "Tanh":
        return _tanh_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _norm_and_sum(total: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm(total, weight), total


def _twice(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return y, y


class Pipelines(dict[str, PipelineInfo]):
    """The catalogue by name. A generated pipeline's name that is not in the generated matrix
    (a shorter sequence `repro shrink` tries) is built on first use from its op keys."""

    def __missing__(self, name: str) -> PipelineInfo:
        keys = keys_of(name)
        if keys is None or not valid(keys):
            raise KeyError(name)
        return pipeline_of(keys)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default


PIPELINES = Pipelines({
    p.name: p
    for p in (
        PipelineInfo(
            "fused_residual_rmsnorm", "[MakeExtraOutput, RMSNorm]: Megatron's TEFusedResidualRMSNorm",
            lambda o, k: [o["MakeExtraOutput"](), o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: (rms_norm(x, p[0]), x), exposes_input=True,
            ops_per_group=(2,), makes_extra_output=True, params=(("1.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "fused_residual_rmsnorm_inplace", "[MakeExtraOutput(in_place=True), RMSNorm]",
            lambda o, k: [o["MakeExtraOutput"](in_place=True), o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: (rms_norm(x, p[0]), x), exposes_input=True,
            ops_per_group=(2,), makes_extra_output=True, requires=("in_place_kwarg",),
            params=(("1.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "residual_layernorm", "[MakeExtraOutput, LayerNorm]",
            lambda o, k: [o["MakeExtraOutput"](), o["LayerNorm"](HIDDEN, **k)],
            lambda x, e, p: (layer_norm(x, p[0], p[1]), x), exposes_input=True,
            ops_per_group=(2,), makes_extra_output=True, params=(("1.weight", (HIDDEN,)), ("1.bias", (HIDDEN,))),
        ),
        PipelineInfo(
            "add_residual_rmsnorm", "[AddExtraInput, MakeExtraOutput, RMSNorm]: residual add + norm",
            lambda o, k: [o["AddExtraInput"](), o["MakeExtraOutput"](), o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: (rms_norm(x + e[0], p[0]), x + e[0]), num_extra_inputs=1,
            ops_per_group=(3,), makes_extra_output=True, requires=("in_place_kwarg",),
            params=(("2.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "add_residual_rmsnorm_inplace", "[AddExtraInput(in_place=True), MakeExtraOutput, RMSNorm]",
            lambda o, k: [o["AddExtraInput"](in_place=True), o["MakeExtraOutput"](), o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: _norm_and_sum(add_in_place(x, e[0]), p[0]),
            num_extra_inputs=1, in_place_extra_input=True,
            ops_per_group=(3,), makes_extra_output=True, requires=("in_place_kwarg",),
            params=(("2.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "extra_output_only", "[MakeExtraOutput]: the output is itself the pass-through tensor",
            lambda o, k: [o["MakeExtraOutput"]()], lambda x, e, p: (x, x), exposes_input=True,
            makes_extra_output=True,
        ),
        PipelineInfo("identity", "[Identity]", lambda o, k: [o["Identity"]()], lambda x, e, p: (x,), exposes_input=True),
        PipelineInfo(
            "reshape", "[Reshape]: a view, not the input itself (control)",
            lambda o, k: [o["Reshape"]((-1, HIDDEN))], lambda x, e, p: (x.reshape(-1, HIDDEN),),
        ),
        PipelineInfo(
            "rmsnorm", "[RMSNorm] (control)", lambda o, k: [o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: (rms_norm(x, p[0]),), params=(("0.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "linear_bias_extra", "[BasicLinear, Bias, MakeExtraOutput]: the extra output is computed (control)",
            lambda o, k: [o["BasicLinear"](HIDDEN, HIDDEN, **k), o["Bias"](HIDDEN, **k), o["MakeExtraOutput"]()],
            lambda x, e, p: _twice(x @ p[0].t() + p[1]),
            ops_per_group=(3,), makes_extra_output=True, extra_output_is_main_output=True,
            params=(("0.weight", (HIDDEN, HIDDEN)), ("1.bias", (HIDDEN,))),
        ),
        PipelineInfo(
            "split_fuser", "[MakeExtraOutput, torch.nn.Tanh-like module, RMSNorm]: two fuser groups",
            lambda o, k: [o["MakeExtraOutput"](), _tanh_class()(), o["RMSNorm"](HIDDEN, **k)],
            lambda x, e, p: (rms_norm(x.tanh(), p[0]), x), exposes_input=True,
            ops_per_group=(1, 1), makes_extra_output=True, requires=("extra_tensors_across_groups",),
            params=(("2.weight", (HIDDEN,)),),
        ),
        PipelineInfo(
            "residual_mlp", "[MakeExtraOutput, RMSNorm, BasicLinear, Bias, GELU, BasicLinear, Bias]: pre-norm MLP",
            lambda o, k: [
                o["MakeExtraOutput"](), o["RMSNorm"](HIDDEN, **k), o["BasicLinear"](HIDDEN, 2 * HIDDEN, **k),
                o["Bias"](2 * HIDDEN, **k), o["GELU"](), o["BasicLinear"](2 * HIDDEN, HIDDEN, **k), o["Bias"](HIDDEN, **k),
            ],
            lambda x, e, p: (
                gelu(rms_norm(x, p[0]) @ p[1].t() + p[2]) @ p[3].t() + p[4], x,
            ),
            exposes_input=True,
            ops_per_group=(7,), makes_extra_output=True,
            params=(("1.weight", (HIDDEN,)), ("2.weight", (2 * HIDDEN, HIDDEN)), ("3.bias", (2 * HIDDEN,)),
                    ("5.weight", (HIDDEN, 2 * HIDDEN)), ("6.bias", (HIDDEN,))),
        ),
    )
})
# The generated pipelines (cases/ops/generated.py), by their own names (`gen.` and the op keys).
PIPELINES.update(GENERATED)
