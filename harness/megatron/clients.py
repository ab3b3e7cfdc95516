"""Megatron's own modules as clients of the fuser: the test side and its reference, built
from the same weights. The engine calls `build_client` and runs the two sides.

- `megatron_norm`: Megatron's `TENorm(config, hidden, has_residual=True)` with
  `fused_residual_rmsnorm=True`, i.e. `TEFusedResidualRMSNorm` (a subclass of TE's
  `te.pytorch.RMSNorm`, whose forward is `Sequential(MakeExtraOutput, RMSNorm)`), called
  directly; the engine wraps it in its recompute wrappers. Reference: plain torch.
- `megatron_block`: a real 2-layer MLA `TransformerBlock` from Megatron's local GPT spec, with
  `input_layernorm` from `TESpecProvider().layer_norm(rms_norm=True, has_residual=True)`, at
  world size 1. `recompute` is Megatron's own: "full_block" (recompute_granularity="full",
  method "block", 1 layer), "full_uniform" (method "uniform", 1 layer per chunk) or "none"
  (the control). Reference: the same block, same weights, without recompute, its
  input_layernorm the local spec's own (torch), so the reference never runs TE's fuser.

Harness code on the block's path, and why: an explicit CPU causal mask (the local attention's
fused mask kernel is CUDA-only), and `_MLACoreAttention`, because MLA hands its core attention
`k_channels`/`v_channels`, which only TE's attention takes; the local one reads the head size
from the config (`kv_channels`, set to `v_head_dim`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.engine import seeding
from harness.errors import UsageError
from harness.megatron.loader import LoadedMegatron
from harness.megatron.norm_reference import EPS, HIDDEN, INPUT_SHAPE, SEQ, norm_reference, norm_weight
from harness.targets.loader import LoadedTarget

CLIENTS = ("megatron_norm", "megatron_block")
# Megatron's own recompute settings for the block: name -> (granularity, method).
BLOCK_RECOMPUTES = {"full_block": ("full", "block"), "full_uniform": ("full", "uniform"), "none": (None, None)}
HEADS, KV_LORA_RANK, QK_HEAD_DIM, QK_POS_DIM, V_HEAD_DIM = 2, 16, 16, 8, 16


@dataclass
class ClientParts:
    """One client case's two sides. Both take the hidden states and return a tuple of tensors."""

    name: str
    test: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    reference: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    test_params: dict[str, torch.nn.Parameter]
    reference_params: dict[str, torch.Tensor]
    input_shape: tuple[int, ...]
    description: str
    modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)  # what ran, for structure checks


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, tuple):
        return tuple(o for o in out if isinstance(o, torch.Tensor))
    return (out,)


_PARALLEL_STATE_READY = False


def ensure_parallel_state(megatron: LoadedMegatron, seed: int) -> None:
    """World size 1 over gloo and Megatron's model-parallel groups, once per process;
    then Megatron's RNG tracker, re-seeded on every call (through the CPU redirects)."""
    global _PARALLEL_STATE_READY
    parallel_state = megatron.module("parallel_state")
    if not _PARALLEL_STATE_READY:
        if not torch.distributed.is_initialized():
            # An in-memory store: a file store left a folder in /tmp behind every worker.
            torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        _PARALLEL_STATE_READY = True
    random = megatron.module("tensor_parallel.random")
    random.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    # A case that raised inside CheckpointFunction.forward left Megatron's flag set.
    random._unset_checkpointing()


def _config(megatron: LoadedMegatron, dtype: torch.dtype, recompute: str, **overrides: Any) -> Any:
    granularity, method = BLOCK_RECOMPUTES[recompute]
    fields = {
        "num_layers": 2, "hidden_size": HIDDEN, "num_attention_heads": HEADS, "ffn_hidden_size": 2 * HIDDEN,
        "q_lora_rank": None, "kv_lora_rank": KV_LORA_RANK, "qk_head_dim": QK_HEAD_DIM,
        "qk_pos_emb_head_dim": QK_POS_DIM, "v_head_dim": V_HEAD_DIM, "kv_channels": V_HEAD_DIM,
        "rope_type": "rope", "normalization": "RMSNorm", "fused_residual_rmsnorm": True,
        "recompute_granularity": granularity, "recompute_method": method,
        "recompute_num_layers": 1 if granularity else None,
        "use_cpu_initialization": True, "params_dtype": dtype, "bf16": dtype == torch.bfloat16,
        "pipeline_dtype": dtype, "hidden_dropout": 0.0, "attention_dropout": 0.0, "add_bias_linear": False,
        "gradient_accumulation_fusion": False, "bias_dropout_fusion": False, "apply_rope_fusion": False,
        "masked_softmax_fusion": False, "persist_layer_norm": False, "layernorm_epsilon": EPS,
    }
    fields.update(overrides)
    with warnings.catch_warnings():  # 0.19 warns that its own default cuda_graph_scope is deprecated
        warnings.filterwarnings("ignore", message="full scope is deprecated")
        return megatron.module("transformer.transformer_config").MLATransformerConfig(**fields)


def _clone_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in module.named_parameters()}


def _norm(megatron: LoadedMegatron, dtype: torch.dtype, device: str, seed: int) -> ClientParts:
    config = _config(megatron, dtype, "none")
    te_norm = megatron.module("extensions.transformer_engine").TENorm
    module = te_norm(config, HIDDEN, has_residual=True).to(device)
    with torch.no_grad():  # the case's weight, which the judge's reference draws too
        module.weight.copy_(norm_weight(seed, dtype, device))
    ref_params = _clone_params(module)

    def test(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _as_tuple(module(x))

    return ClientParts("megatron_norm", test, norm_reference(ref_params["weight"]), dict(module.named_parameters()),
                       ref_params, INPUT_SHAPE, f"{type(module).__module__}.{type(module).__qualname__}"
                       f"(has_residual=True) -> (normalized, residual); reference: torch rms_norm",
                       {"norm": module})


def _mla_core_attention(megatron: LoadedMegatron) -> type:
    dot_product_attention = megatron.module("transformer.dot_product_attention").DotProductAttention

    class _MLACoreAttention(dot_product_attention):  # type: ignore[misc, valid-type]
        """Megatron's local core attention, taking the two MLA arguments it has no use for."""

        def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if v_channels is not None and v_channels != self.config.kv_channels:
                raise ValueError(f"v_channels {v_channels} != kv_channels {self.config.kv_channels}")

    return _MLACoreAttention


def _block(megatron: LoadedMegatron, dtype: torch.dtype, device: str, recompute: str) -> ClientParts:
    if recompute not in BLOCK_RECOMPUTES:
        raise UsageError(f"unknown block recompute {recompute!r}; valid: {', '.join(BLOCK_RECOMPUTES)}")
    specs = megatron.module("models.gpt.gpt_layer_specs")
    provider = megatron.module("extensions.transformer_engine_spec_provider").TESpecProvider()

    def layer_spec(te_norm: bool) -> Any:
        spec = specs.get_gpt_layer_local_spec(multi_latent_attention=True, normalization="RMSNorm")
        if te_norm:
            spec.submodules.input_layernorm = provider.layer_norm(rms_norm=True, has_residual=True)
        spec.submodules.self_attention.submodules.core_attention = _mla_core_attention(megatron)
        return spec

    block_class = megatron.module("transformer.transformer_block").TransformerBlock
    test_block = block_class(_config(megatron, dtype, recompute), layer_spec(te_norm=True)).to(device)
    # The reference keeps the local spec's own input_layernorm (torch's RMSNorm; the layer then
    # takes the residual from its input): the same computation, never through TE's fuser, so
    # the reference cannot have the bug under test, under no_grad either.
    ref_block = block_class(_config(megatron, dtype, "none"), layer_spec(te_norm=False)).to(device)
    for layer in ref_block.layers:  # torch's norm is built in float32 whatever params_dtype says
        layer.input_layernorm.to(dtype)
    # TE's modules add an `_extra_state` entry (FP8 metadata; none here) that torch's norm has no use for.
    state = test_block.state_dict()
    ref_block.load_state_dict({k: v for k, v in state.items() if not k.endswith("input_layernorm._extra_state")})
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=device), diagonal=1).view(1, 1, SEQ, SEQ)

    def runner(block: torch.nn.Module) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
        return lambda x: _as_tuple(block(hidden_states=x, attention_mask=mask))

    method = BLOCK_RECOMPUTES[recompute]
    return ClientParts(
        "megatron_block", runner(test_block), runner(ref_block), dict(test_block.named_parameters()),
        dict(ref_block.named_parameters()), INPUT_SHAPE,
        f"TransformerBlock(2 MLA layers, input_layernorm "
        f"{type(test_block.layers[0].input_layernorm).__qualname__}, recompute {method[0] or 'none'}"
        f"{'/' + method[1] if method[1] else ''}); reference: the same block without recompute",
        {"block": test_block, "reference_block": ref_block},
    )


def fused_norm_structure(parts: ClientParts) -> list[list[str]]:
    """For each TEFusedResidualRMSNorm that has run, the classes of its fused pipeline's ops
    (module.qualname), so a record can show that TE's own MakeExtraOutput and RMSNorm ran."""
    found = []
    for root in parts.modules.values():
        for module in root.modules():
            fused: Any = getattr(module, "_fused_impl", None)  # TE sets it: a one-item tuple of te.ops.Sequential
            if type(module).__name__ == "TEFusedResidualRMSNorm" and fused:
                found.append([f"{type(op).__module__}.{type(op).__qualname__}" for op in fused[0].children()])
    return found


def build_client(name: str, target: LoadedTarget, megatron: LoadedMegatron, *, recompute: str = "none",
                 dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> ClientParts:
    """Build one client case's test and reference sides on a loaded target and Megatron.

    `recompute` is the block's own Megatron setting ("full_block", "full_uniform", "none");
    for `megatron_norm` it must be "none" (the engine's recompute wrappers go around it).
    Weights come from `seed`; the same arguments build the same weights.
    """
    if name not in CLIENTS:
        raise UsageError(f"unknown client {name!r}; valid: {', '.join(CLIENTS)}")
    if "RMSNorm" not in target.te_modules:
        raise UsageError(f"{target.prepared.spec}: TE's own te.pytorch.RMSNorm does not run on the CPU backend (not loaded)")
    if not megatron.has_fused_residual_rmsnorm:
        raise UsageError(f"megatron-core {megatron.prepared.version} on {target.prepared.spec} does not define "
                         "TEFusedResidualRMSNorm (it needs megatron-core >= 0.17 and TE >= 1.13)")
    ensure_parallel_state(megatron, seed)
    seeding.manual_seed(seed)
    if name == "megatron_norm":
        if recompute != "none":
            raise UsageError("megatron_norm takes the engine's recompute wrappers, not a block recompute")
        return _norm(megatron, dtype, device, seed)
    return _block(megatron, dtype, device, recompute)
