"""The call scenario's axes (cases/scenarios.py). These names and values are stable: case
ids, CLI filters, JSON and reports use them. A regression of that scenario names the
values it varies (cases/regression.py `own_axes`); a case id is its regression id and its
axis values in this order. A value added here joins no regression's matrix by itself."""

from __future__ import annotations

from cases.ops.generated import GENERATED

AXES: dict[str, tuple[str, ...]] = {
    # ops: the harness's te.ops pipelines; megatron_*: Megatron's own modules (cases/clients.py).
    "client": ("ops", "megatron_norm", "megatron_block"),
    "pipeline": (
        "fused_residual_rmsnorm",
        "fused_residual_rmsnorm_inplace",
        "residual_layernorm",
        "add_residual_rmsnorm",
        "add_residual_rmsnorm_inplace",
        "extra_output_only",
        "identity",
        "reshape",
        "rmsnorm",
        "linear_bias_extra",
        "split_fuser",
        "residual_mlp",
        *GENERATED,  # generated from the op database (cases/ops/generated.py): `gen.` and op keys
    ),
    "grad_mode": ("enabled", "no_grad", "inference_mode", "enable_grad_inside_no_grad"),
    "input": ("leaf", "leaf_requires_grad", "non_leaf", "view", "detached"),
    "params": ("trainable", "frozen"),
    # The first four wrap the call; full_block and full_uniform are a Megatron TransformerBlock's
    # own setting (recompute_granularity="full", method block or uniform), megatron_block only.
    "recompute": ("none", "checkpoint_reentrant", "checkpoint_non_reentrant", "megatron", "full_block", "full_uniform"),
    "sequence": ("single", "recompute_pattern"),
    # The form of the upstream gradient: dense (a weighted loss) or expanded (a plain
    # .sum(), whose gradient is a stride-0 view that cannot be written into).
    "grad_form": ("dense", "expanded"),
    "dtype": ("float32", "bfloat16", "float16"),
    "device": ("cpu", "cuda", "npu"),
}

# What each input kind is, for the rules: whether the caller's tensor requires grad,
# and whether it is a leaf.
INPUTS_REQUIRING_GRAD = ("leaf_requires_grad", "non_leaf", "view")
NON_LEAF_INPUTS = ("non_leaf", "view")
# Leaves that need no grad: a fresh tensor, or one detached from a graph.
LEAVES_WITHOUT_GRAD = ("leaf", "detached")


def narrowed(over: dict[str, tuple[str, ...]] = AXES, **chosen: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """A preset over the axes `over` (a regression's own): each axis at its first value,
    except the axes given."""
    return {axis: chosen.get(axis, values[:1]) for axis, values in over.items()}
