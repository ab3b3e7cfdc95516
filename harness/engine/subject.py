"""What a case calls and compares (Subject), the dtypes by name, and Megatron's import: shared by
the engine (harness/engine/execute.py) and the Megatron client cases (harness/megatron/cases.py),
so neither imports the other back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def import_megatron(device: str) -> Any:
    """Megatron's own tensor_parallel.random, from the Megatron source under test
    (harness.megatron), imported after this process's TE target: Megatron probes TE at import."""
    from harness.megatron.loader import load_megatron, loaded, prepared_for_process
    from harness.targets.loader import loaded as loaded_target

    megatron = loaded()
    if megatron is None:
        target = loaded_target()
        if target is None:
            raise RuntimeError("load the TE target before Megatron: Megatron probes TE at import")
        megatron = load_megatron(prepared_for_process(), target, device)
    return megatron.module("tensor_parallel.random")


@dataclass
class Subject:
    """What one case calls and compares: the test side and the reference side, built from the
    same values, with their parameters, and the shape of the caller's input."""

    test: Callable[..., Any]
    reference: Callable[..., Any]
    params: dict[str, torch.Tensor]
    reference_params: dict[str, torch.Tensor]
    input_shape: tuple[int, ...]
    # Extra record fields for an error of the test side (Megatron: the frames against the report's).
    describe_error: Callable[[BaseException], dict[str, Any]] = lambda exc: {}
    # The test side's modules, whose TE fusers the record reads the fused ops off (Megatron's block or norm).
    modules: tuple[torch.nn.Module, ...] = ()
