"""Plain-torch stand-ins for the compiled kernels TE's own norm ops call.

TE's `ops/basic/rmsnorm.py` and `ops/basic/layer_norm.py` (and, through them, the
`te.pytorch.RMSNorm`/`LayerNorm` modules Megatron subclasses) call four functions of the
compiled extension `transformer_engine_torch`. These have the same signatures and return
the same tuples, so the ops run as shipped; only the arithmetic below is ours. As in TE's
kernels, statistics are computed in float32 and the outputs cast to the requested dtype.

Quantized outputs (an FP8 `quantizer`) are refused: FP8 is disabled on the CPU backend.
"""

from __future__ import annotations

import enum
from typing import Any

import torch


class DType(enum.IntEnum):
    """`transformer_engine_torch.DType`: the members and values of TE's C enum `NVTEDType`
    that the pybind enum exposes (2.20's constants.py asserts the member set)."""

    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


class FP8FwdTensors(enum.IntEnum):
    """Index names of FP8 scaling factors; constants.py reads them at import (2.20)."""

    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    """Backward counterpart of `FP8FwdTensors`."""

    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


class FP8TensorMeta:
    """Type stand-in: ops/_common.py builds one only for FP8 tensors, never on the CPU."""


TORCH_DTYPE = {
    DType.kByte: torch.uint8, DType.kInt32: torch.int32, DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16, DType.kBFloat16: torch.bfloat16,
}


def _out_dtype(otype: Any) -> torch.dtype:
    try:
        return TORCH_DTYPE[DType(int(otype))]
    except (KeyError, ValueError):
        raise NotImplementedError(f"output dtype {otype!r} is not available on the CPU backend") from None


def _no_quantizer(quantizer: Any) -> None:
    if quantizer is not None:
        raise NotImplementedError("quantized norm outputs (FP8) are not available on the CPU backend")


def _store(out: torch.Tensor, ln_out: torch.Tensor | None) -> torch.Tensor:
    """TE writes into a caller-given output buffer when there is one."""
    if ln_out is None:
        return out
    ln_out.copy_(out)
    return ln_out


def _gamma(weight: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    w = weight.float()
    return w + 1 if zero_centered_gamma else w


def rmsnorm_fwd(input: torch.Tensor, weight: torch.Tensor, eps: float, ln_out: torch.Tensor | None,
                quantizer: Any, otype: Any, sm_margin: int, zero_centered_gamma: bool) -> tuple[Any, ...]:
    """Returns (output, None, rsigma): RMSNorm has no mean; rsigma is float32, one per row."""
    _no_quantizer(quantizer)
    x = input.float()
    rsigma = torch.rsqrt(x.pow(2).mean(-1) + eps)
    y = x * rsigma.unsqueeze(-1) * _gamma(weight, zero_centered_gamma)
    return _store(y.to(_out_dtype(otype)), ln_out), None, rsigma


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                sm_margin: int, zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dx, dgamma) in the dtypes of x and gamma."""
    dy, r = dz.float(), rsigma.float().unsqueeze(-1)
    x_hat = x.float() * r
    g = dy * _gamma(gamma, zero_centered_gamma)
    dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dgamma = (dy * x_hat).sum(0)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


def layernorm_fwd(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                  ln_out: torch.Tensor | None, quantizer: Any, otype: Any, sm_margin: int,
                  zero_centered_gamma: bool) -> tuple[Any, ...]:
    """Returns (output, mu, rsigma); mu and rsigma are float32, one per row."""
    _no_quantizer(quantizer)
    x = input.float()
    mu = x.mean(-1)
    rsigma = torch.rsqrt(x.var(-1, unbiased=False) + eps)
    y = (x - mu.unsqueeze(-1)) * rsigma.unsqueeze(-1) * _gamma(weight, zero_centered_gamma) + bias.float()
    return _store(y.to(_out_dtype(otype)), ln_out), mu, rsigma


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                  sm_margin: int, zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dx, dgamma, dbeta)."""
    dy, r = dz.float(), rsigma.float().unsqueeze(-1)
    x_hat = (x.float() - mu.float().unsqueeze(-1)) * r
    g = dy * _gamma(gamma, zero_centered_gamma)
    dx = r * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (dy * x_hat).sum(0).to(gamma.dtype), dy.sum(0).to(gamma.dtype)


# What the `transformer_engine_torch` stand-in exposes from this module.
KERNELS = {f.__name__: f for f in (rmsnorm_fwd, rmsnorm_bwd, layernorm_fwd, layernorm_bwd)}
ENUMS = {c.__name__: c for c in (DType, FP8FwdTensors, FP8BwdTensors, FP8TensorMeta)}
