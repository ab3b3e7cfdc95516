"""The case axes. These names and values are stable: CLI filters, JSON and reports use them."""

from __future__ import annotations

AXES: dict[str, tuple[str, ...]] = {
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
    ),
    "grad_mode": ("enabled", "no_grad", "inference_mode", "enable_grad_inside_no_grad"),
    "input": ("leaf", "leaf_requires_grad", "non_leaf", "view", "detached"),
    "params": ("trainable", "frozen"),
    "recompute": ("none", "checkpoint_reentrant", "checkpoint_non_reentrant", "megatron"),
    "sequence": ("single", "recompute_pattern"),
    "dtype": ("float32", "bfloat16", "float16"),
    "device": ("cpu", "cuda", "npu"),
}
