"""The device TE asks about, on a machine without a GPU: the only place it is answered.

TE's Python code asks torch about the CUDA device at call time, not only at import:
`is_fp8_available()` and the GEMM workspace size read the compute capability through
`torch.cuda.get_device_properties(torch.cuda.current_device())`, and upstream's test
utilities save and restore `torch.cuda.get_rng_state()`. CPU torch raises on each. On the CPU
backend they answer as one device **without FP8**: compute capability 8.0 (FP8 needs 8.9, so
TE itself reports FP8, MXFP8 and NVFP4 unavailable and skips their paths), and a CUDA
generator of its own, seeded like torch's CPU generator. `torch.cuda.is_available()` still
says False, and anything else under torch.cuda fails as CPU torch makes it fail.

Installed process-wide by the loader (`install`), before the target is imported.

One TE function is replaced, after import (`place_te_allocations`): `utils._empty_tensor`,
the placeholder that `clear_tensor_data` (every op's backward) points freed saved tensors
at, is allocated with `torch.Tensor().cuda()`; on the CPU backend it is a CPU tensor.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

CAPABILITY = (8, 0)
NAME = "CPU backend (no FP8): compute capability 8.0"
_generator = torch.Generator()

PROPERTIES = types.SimpleNamespace(
    name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], multi_processor_count=1,
    total_memory=0, is_integrated=False, is_multi_gpu_board=False,
)


def current_device() -> int:
    return 0


def get_device_properties(_device: Any = None) -> types.SimpleNamespace:
    return PROPERTIES


def get_device_capability(_device: Any = None) -> tuple[int, int]:
    return CAPABILITY


def get_device_name(_device: Any = None) -> str:
    return NAME


def get_rng_state(_device: Any = "cuda") -> torch.Tensor:
    return _generator.get_state()


def set_rng_state(state: torch.Tensor, _device: Any = "cuda") -> None:
    _generator.set_state(state)


def manual_seed(seed: int) -> None:
    _generator.manual_seed(seed)


ANSWERS = {f.__name__: f for f in (current_device, get_device_properties, get_device_capability,
                                   get_device_name, get_rng_state, set_rng_state, manual_seed)}


@functools.cache
def _empty_cpu_tensor() -> torch.Tensor:
    return torch.Tensor()


def place_te_allocations(utils_module: types.ModuleType | None) -> list[str]:
    """TE's CUDA-only placeholder allocation, made on the CPU (see the module docstring)."""
    if torch.cuda.is_available() or utils_module is None or not hasattr(utils_module, "_empty_tensor"):
        return []
    utils_module._empty_tensor = _empty_cpu_tensor
    return ["transformer_engine.pytorch.utils._empty_tensor"]


def install() -> list[str]:
    """Answer the queries above in torch.cuda (idempotent); returns their names. A CUDA
    build of torch with a device keeps its own answers."""
    if torch.cuda.is_available():
        return []
    for name, answer in ANSWERS.items():
        setattr(torch.cuda, name, answer)
    return [f"torch.cuda.{name}" for name in ANSWERS]
