"""Plain-torch stand-ins for TE's own Triton kernels, the other compiled part of TE.

`transformer_engine/common/triton/*.py` define `@triton.jit` kernels, which TE's PyTorch
wrappers (`pytorch/triton/*.py`) launch as `kernel[grid](*args, **constexprs)`. On a host
without a GPU Triton has no driver ("0 active drivers"), so at the import boundary each
module there runs as shipped and then each of its JIT kernels is replaced by a `Launch`:
the stand-in below where there is one (same arguments, the arithmetic ours), else one that
raises `MissingKernel` naming the kernel and TE's caller, as the extension's stand-in does.
Each stand-in is compared with a plain-torch reference in tests/test_kernels.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.targets.cpu_backend.kernels import outside_autograd


def grouped_dbias_kernel(dy: torch.Tensor, dbias: torch.Tensor, offsets: torch.Tensor, scales: torch.Tensor,
                         bias: torch.Tensor, dscales: torch.Tensor, hidden: int, *, HAS_SCALES: bool,
                         **_launch: Any) -> None:
    """`_grouped_dbias_kernel` (2.16 on): for the rows i of group g (offsets[g] to offsets[g + 1]),
    with s_i = scales[i] when HAS_SCALES else 1, dbias[g, :] += sum_i dy[i, :] * s_i; with
    HAS_SCALES also dscales[i] += sum_j dy[i, j] * bias[g, j]. Accumulated into the given
    float32 buffers, in float32, as the kernel's atomic adds do."""
    rows = dy.float()
    bounds = offsets.tolist()
    for g in range(dbias.shape[0]):
        group = rows[bounds[g]:bounds[g + 1], :hidden]
        if HAS_SCALES:
            dbias[g, :hidden] += (group * scales[bounds[g]:bounds[g + 1]].float().unsqueeze(-1)).sum(0)
            dscales[bounds[g]:bounds[g + 1]] += (group * bias[g, :hidden].float()).sum(-1)
        else:
            dbias[g, :hidden] += group.sum(0)


KERNELS: dict[str, Callable[..., None]] = {"_grouped_dbias_kernel": outside_autograd(grouped_dbias_kernel)}


class Launch:
    """What `kernel[grid]` gives: the stand-in, called with the launch's arguments."""

    def __init__(self, name: str, run: Callable[..., Any]) -> None:
        self.__name__ = name
        self.run = run

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self.run

    def __repr__(self) -> str:
        return f"<CPU stand-in for the Triton kernel {self.__name__}>"


def is_jit_kernel(value: Any) -> bool:
    """A `@triton.jit` (or autotuned) kernel, known by what triton's classes are, not by import."""
    return any(cls.__module__.startswith("triton.") and cls.__name__ in ("JITFunction", "Autotuner", "Heuristics")
               for cls in type(value).__mro__)
