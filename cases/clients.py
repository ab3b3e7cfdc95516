"""The client catalogue: who calls the fuser. `ops` is the harness's own te.ops pipelines
(cases/pipelines.py); the Megatron clients are Megatron's own modules (harness/megatron/clients.py),
which build their TE pipeline themselves.

The combinations a client cannot run are refused here, each with its reason, so the case
generator counts them (cases/matrix.py) and never enumerates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from cases.case import Case

WRAPPER_RECOMPUTES = ("checkpoint_reentrant", "checkpoint_non_reentrant", "megatron")
BLOCK_RECOMPUTES = ("full_block", "full_uniform")  # a TransformerBlock's own recompute_method


@dataclass(frozen=True)
class ClientInfo:
    name: str
    description: str
    pipeline: str | None  # the te.ops pipeline the client builds itself; None: the pipeline axis chooses
    recomputes: tuple[str, ...]  # the recompute values it takes
    uses_megatron: bool


CLIENTS: dict[str, ClientInfo] = {
    c.name: c
    for c in (
        ClientInfo("ops", "a te.ops.Sequential from the pipeline catalogue", None, ("none", *WRAPPER_RECOMPUTES),
                   uses_megatron=False),
        ClientInfo(
            "megatron_norm",
            "Megatron's TENorm(config, hidden, has_residual=True), fused_residual_rmsnorm=True: "
            "TEFusedResidualRMSNorm, i.e. Sequential(MakeExtraOutput, RMSNorm); the engine's recompute wraps it",
            "fused_residual_rmsnorm", ("none", *WRAPPER_RECOMPUTES), uses_megatron=True,
        ),
        ClientInfo(
            "megatron_block",
            "Megatron's 2-layer MLA TransformerBlock, input_layernorm = TEFusedResidualRMSNorm; recompute is "
            "the block's own (full/block, full/uniform) or none (the control)",
            "fused_residual_rmsnorm", ("none", *BLOCK_RECOMPUTES), uses_megatron=True,
        ),
    )
}


def needs_megatron(case: Case) -> bool:
    """Whether the case's process must import Megatron (its client, or its recompute wrapper);
    a case of a scenario without these axes does not."""
    client = CLIENTS.get(case.get("client") or "")
    return (client is not None and client.uses_megatron) or case.get("recompute") == "megatron"


def client_exclusion(case: Case) -> str | None:
    """Why a client cannot build this combination at all (its recompute, its pipeline), or None."""
    client = CLIENTS[case.client]
    if case.recompute not in client.recomputes:
        if case.recompute in BLOCK_RECOMPUTES:
            return f"recompute {case.recompute} is a Megatron TransformerBlock's own setting: megatron_block only"
        return (f"{case.client} recomputes with the block's own setting (full_block, full_uniform) or none; "
                "Megatron never wraps a whole block in another recompute")
    if client.pipeline is not None and case.pipeline != client.pipeline:
        return (f"{case.client} builds its own TE pipeline (TEFusedResidualRMSNorm = MakeExtraOutput, RMSNorm), "
                f"named by pipeline {client.pipeline}")
    return None


def client_call_exclusion(case: Case) -> str | None:
    """Why a client's call makes no sense for these inputs, or None; asked after the exclusions
    common to every client (cases/matrix.py), so those keep their own counts."""
    if case.client == "megatron_block" and case.recompute in BLOCK_RECOMPUTES and case.input in ("leaf", "detached"):
        # Megatron's CheckpointFunction is reentrant: its output requires grad only when an input does.
        return ("full recompute (a reentrant CheckpointFunction) gives hidden states that do not require grad an "
                "output that does not either, so no parameter gets a gradient; training feeds ones that do")
    if case.client == "megatron_block" and case.grad_mode == "inference_mode" and case.input == "view":
        # Seen on every release from 2.13.0 to 2.20.2, so not a fuser regression: the block replaces a
        # view by make_viewless_tensor's copy, and TE's RMSNorm op cannot .view() that copy in inference mode.
        return ("under inference_mode TransformerBlock's viewless copy of a view makes TE's RMSNorm raise "
                "'Inference tensors do not track version counter' on every release (not a fuser regression)")
    return None
