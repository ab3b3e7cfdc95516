"""TE's SiTU-GLU (2.19 on) and the per-row scaled activations of its grouped MLP (ScaledSwiGLU,
ScaledSiTUGLU, ScaledClampedQGeGLU, ScaledSReLU: `tex.scaled_*`, 2.19 on) on the CPU backend.

A GLU splits the last dimension into a gate half and a value half (or, with a block
interleave size k, alternating blocks of k), and multiplies gate(a) by value(b); each is
computed in float32 and stored once in the input's dtype, as TE's kernels do. The scaled forms
multiply each row's result by its scale and, in backward, give the scales' gradient when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Glu:
    gate: Fn
    dgate: Fn
    value: Fn = lambda b: b
    dvalue: Fn = torch.ones_like


def _silu_derivative(a: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


def swiglu_math() -> Glu:
    return Glu(torch.nn.functional.silu, _silu_derivative)


def situ_math(beta1: float, beta2: float) -> Glu:
    """Kimi K3's soft-capped SiLU GLU: beta1 tanh(a/beta1) sigmoid(a) times beta2 tanh(b/beta2)."""
    def gate(a: torch.Tensor) -> torch.Tensor:
        return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a)

    def dgate(a: torch.Tensor) -> torch.Tensor:
        t, s = torch.tanh(a / beta1), torch.sigmoid(a)
        return (1 - t * t) * s + beta1 * t * s * (1 - s)

    return Glu(gate, dgate, lambda b: beta2 * torch.tanh(b / beta2), lambda b: 1 - torch.tanh(b / beta2) ** 2)


def clamped_math(limit: float, alpha: float, offset: float) -> Glu:
    """GPT-OSS's clamped SwiGLU: no gradient flows through a clamped element."""
    def gate(a: torch.Tensor) -> torch.Tensor:
        c = a.clamp(max=limit)
        return c * torch.sigmoid(alpha * c)

    def dgate(a: torch.Tensor) -> torch.Tensor:
        c = a.clamp(max=limit)
        s = torch.sigmoid(alpha * c)
        return (s * (1 + alpha * c * (1 - s))) * (a <= limit)

    return Glu(gate, dgate, lambda b: b.clamp(-limit, limit) + offset, lambda b: ((b >= -limit) & (b <= limit)).float())


def _halves(x: torch.Tensor, interleave: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and value halves in float32; with interleave k > 0, blocks of k alternate."""
    x = x.float()
    if interleave:
        width = x.shape[-1]
        x = x.reshape(-1, width // (2 * interleave), 2, interleave).transpose(1, 2).reshape(*x.shape)
    gate, value = x.chunk(2, dim=-1)
    return gate, value


def _joined(dgate: torch.Tensor, dvalue: torch.Tensor, interleave: int) -> torch.Tensor:
    dx = torch.cat([dgate, dvalue], dim=-1)
    if interleave:
        width = dx.shape[-1]
        dx = dx.reshape(-1, 2, width // (2 * interleave), interleave).transpose(1, 2).reshape(*dx.shape)
    return dx


def _no_quantizer(quantizer: Any) -> None:
    if quantizer is not None:
        raise NotImplementedError("a quantized GLU output needs FP8, which the CPU backend's device lacks")


def glu_forward(glu: Glu, x: torch.Tensor, scales: torch.Tensor | None = None, interleave: int = 0) -> torch.Tensor:
    gate, value = _halves(x, interleave)
    y = glu.gate(gate) * glu.value(value)
    if scales is not None:
        y = y * scales.float().unsqueeze(-1)
    return y.to(x.dtype)


def glu_backward(glu: Glu, dy: torch.Tensor, x: torch.Tensor, scales: torch.Tensor | None = None,
                 interleave: int = 0, scale_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    gate, value = _halves(x, interleave)
    grad = dy.float()
    dscales = (grad * glu.gate(gate) * glu.value(value)).sum(-1).to(scales.dtype) if scale_grad and scales is not None \
        else None
    if scales is not None:
        grad = grad * scales.float().unsqueeze(-1)
    dx = _joined(grad * glu.value(value) * glu.dgate(gate), grad * glu.gate(gate) * glu.dvalue(value), interleave)
    return dx.to(x.dtype), dscales


def situglu(input: torch.Tensor, quantizer: Any, beta1: float = 4.0, beta2: float = 25.0) -> torch.Tensor:
    _no_quantizer(quantizer)
    return glu_forward(situ_math(beta1, beta2), input)


def dsituglu(grad: torch.Tensor, input: torch.Tensor, quantizer: Any, beta1: float = 4.0,
             beta2: float = 25.0) -> torch.Tensor:
    _no_quantizer(quantizer)
    return glu_backward(situ_math(beta1, beta2), grad, input)[0]


def scaled_swiglu(input: torch.Tensor, scales: torch.Tensor, quantizer: Any, interleave: int = 0) -> torch.Tensor:
    _no_quantizer(quantizer)
    return glu_forward(swiglu_math(), input, scales, interleave)


def scaled_dswiglu(grad: torch.Tensor, input: torch.Tensor, scales: torch.Tensor, quantizer: Any,
                   interleave: int = 0, compute_scale_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    _no_quantizer(quantizer)
    return glu_backward(swiglu_math(), grad, input, scales, interleave, compute_scale_grad)


def scaled_situglu(input: torch.Tensor, scales: torch.Tensor, quantizer: Any, beta1: float, beta2: float,
                   interleave: int = 0) -> torch.Tensor:
    _no_quantizer(quantizer)
    return glu_forward(situ_math(beta1, beta2), input, scales, interleave)


def scaled_dsituglu(grad: torch.Tensor, input: torch.Tensor, scales: torch.Tensor, quantizer: Any, beta1: float,
                    beta2: float, interleave: int = 0,
                    compute_scale_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    _no_quantizer(quantizer)
    return glu_backward(situ_math(beta1, beta2), grad, input, scales, interleave, compute_scale_grad)


def scaled_clamped_swiglu(input: torch.Tensor, scales: torch.Tensor, quantizer: Any, limit: float, alpha: float,
                          glu_linear_offset: float, interleave: int = 0) -> torch.Tensor:
    _no_quantizer(quantizer)
    return glu_forward(clamped_math(limit, alpha, glu_linear_offset), input, scales, interleave)


def scaled_clamped_dswiglu(grad: torch.Tensor, input: torch.Tensor, scales: torch.Tensor, quantizer: Any,
                           limit: float, alpha: float, glu_linear_offset: float, interleave: int = 0,
                           compute_scale_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    _no_quantizer(quantizer)
    return glu_backward(clamped_math(limit, alpha, glu_linear_offset), grad, input, scales, interleave,
                        compute_scale_grad)


def scaled_srelu(input: torch.Tensor, scales: torch.Tensor, quantizer: Any) -> torch.Tensor:
    """relu(x)^2, each row times its scale."""
    _no_quantizer(quantizer)
    return (torch.relu(input.float()).square() * scales.float().unsqueeze(-1)).to(input.dtype)


def scaled_dsrelu(grad: torch.Tensor, input: torch.Tensor, scales: torch.Tensor, quantizer: Any,
                  compute_scale_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    _no_quantizer(quantizer)
    x, dy = input.float(), grad.float()
    dscales = (torch.relu(x).square() * dy).sum(-1).to(scales.dtype) if compute_scale_grad else None
    return (dy * scales.float().unsqueeze(-1) * 2 * torch.relu(x)).to(input.dtype), dscales


GLU_KERNELS = (scaled_srelu, scaled_dsrelu, situglu, dsituglu, scaled_swiglu, scaled_dswiglu, scaled_situglu, scaled_dsituglu,
               scaled_clamped_swiglu, scaled_clamped_dswiglu)
