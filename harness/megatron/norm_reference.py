"""The megatron_norm client's reference, in plain torch: what the run's judge computes for such a
case in a process that never imported a target nor Megatron (harness.engine.reference), from the
same values the target's worker gives Megatron's TENorm (harness.megatron.clients): the norm's
weight from a generator seeded by the case, the epsilon set in the config both sides read.

Megatron's block has no such reference: its reference is Megatron's own block without recompute,
which needs the target's TE to build (see harness.engine.reference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from harness.engine import calls

HIDDEN, SEQ, BATCH = 32, 8, 2
INPUT_SHAPE = (SEQ, BATCH, HIDDEN)
EPS = 1e-5  # the config's layernorm_epsilon, which TENorm hands TE's RMSNorm


def norm_weight(seed: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The norm's weight for a case's seed: not all ones, so a dropped weight shows."""
    return (torch.rand(HIDDEN, generator=calls.generator(seed, 1)) + 0.5).to(device, dtype)


def norm_reference(weight: torch.Tensor) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """TENorm(has_residual=True)'s computation: the normalized input, and the input as the residual."""
    def reference(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.rms_norm(x.float(), (HIDDEN,), weight.float(), EPS).to(x.dtype), x

    return reference
