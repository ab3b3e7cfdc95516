"""The bug report's minimal scenario: Sequential(MakeExtraOutput(), RMSNorm) on a
non-leaf input under torch.no_grad(), as Megatron's CheckpointFunction runs it."""

from __future__ import annotations

from typing import Any

import torch

from harness.engine.frames import error_record
from harness.targets.loader import LoadedTarget


def run_minimal(target: LoadedTarget, hidden: int = 16) -> dict[str, Any]:
    torch.manual_seed(0)
    ops = target.ops
    module = ops["Sequential"](ops["MakeExtraOutput"](), ops["RMSNorm"](hidden, device="cpu"))  # TE defaults to CUDA
    leaf = torch.randn(4, hidden, requires_grad=True)
    non_leaf = leaf * 2
    try:
        with torch.no_grad():
            outputs = module(non_leaf)
    except Exception as exc:  # noqa: BLE001 — the observation we exist to record
        return {"completed": False, "error": error_record(exc, target.te_dir)}
    shapes = [list(t.shape) for t in (outputs if isinstance(outputs, tuple) else (outputs,))]
    return {"completed": True, "error": None, "output_shapes": shapes}
