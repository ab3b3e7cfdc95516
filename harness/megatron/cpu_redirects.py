"""Every CUDA-only call Megatron makes on the harness's path, pointed at the CPU. Only here.

Megatron's files are never edited. Instead, after they are imported:

1. `tensor_parallel.random._get_cuda_rng_state` / `_set_cuda_rng_state`, which CheckpointFunction
   and the RNG tracker use to save and restore the CUDA generator around a recompute, read and
   write the CPU generator instead (so the real CheckpointFunction runs unchanged).
2. In the modules listed in `TORCH_ON_CPU`, the global name `torch` is a view of torch whose
   `torch.cuda` answers the calls below with the CPU; every other name is torch's own:
   - `torch.cuda.current_device()` -> the CPU device (RoPE's inv_freq, buffers in utils);
   - `torch.cuda.get_rng_state()` / `torch.cuda.manual_seed(seed)` -> the CPU generator
     (`CudaRNGStatesTracker.add` and `model_parallel_cuda_manual_seed` seed the tracker from it).

Anything else under `torch.cuda` still goes to torch.cuda, and fails there as it would.
On a CUDA device nothing is redirected.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import torch

from harness.engine import seeding

# Megatron modules whose `torch.cuda` calls the block and the norm reach on the CPU.
TORCH_ON_CPU = (
    "megatron.core.tensor_parallel.random",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
    "megatron.core.utils",
)


class _CudaOnCpu:
    """`torch.cuda` as seen by a redirected module."""

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def get_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def manual_seed(seed: int) -> None:
        seeding.manual_seed(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """`torch` as seen by a redirected module: torch's own names, but `cuda` is `_CudaOnCpu`."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CudaOnCpu()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _get_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
    torch.set_rng_state(state)


def redirect_rng(random_module: types.ModuleType) -> None:
    """Redirect 1 alone: all the `megatron` recompute wrapper needs."""
    # Megatron's own module globals, replaced in its namespace (the names are not in its stubs)
    random_module.__dict__.update(_get_cuda_rng_state=_get_rng_state, _set_cuda_rng_state=_set_rng_state)


def apply(device: str) -> list[str]:
    """Install every redirect (idempotent); returns what was redirected, for the description."""
    if device == "cuda":
        return []
    random_module = importlib.import_module("megatron.core.tensor_parallel.random")
    redirect_rng(random_module)
    done = ["tensor_parallel.random._get/_set_cuda_rng_state -> CPU generator"]
    view = _TorchOnCpu()
    for name in TORCH_ON_CPU:
        module = sys.modules.get(name) or importlib.import_module(name)
        if not isinstance(module.__dict__.get("torch"), _TorchOnCpu):
            module.__dict__["torch"] = view
        done.append(f"{name.removeprefix('megatron.core.')}: torch.cuda.current_device/get_rng_state/manual_seed -> CPU")
    return done
