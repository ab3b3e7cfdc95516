"""Plain-PyTorch references of TE's basic ops, shared by the hand-written pipelines
(cases/pipelines.py) and the op database (cases/ops/database.py). Each computes in float32 and
stores once in the input's dtype, as TE's kernels do. torch is imported where a reference
runs: every `repro` command reads the catalogues that name these."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x32 = x.float()
    return (x32 * (x32.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), 1e-5).to(x.dtype)


def l2_normalization(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x32 = x.float()
    return (x32 * (x32.pow(2).sum(-1, keepdim=True) + eps).rsqrt()).to(x.dtype)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """TE's GELU: the tanh approximation."""
    import torch.nn.functional as F

    return F.gelu(x.float(), approximate="tanh").to(x.dtype)


def qgelu(x: torch.Tensor) -> torch.Tensor:
    import torch

    x32 = x.float()
    return (x32 * torch.sigmoid(1.702 * x32)).to(x.dtype)


def relu(x: torch.Tensor) -> torch.Tensor:
    return x.float().relu().to(x.dtype)


def srelu(x: torch.Tensor) -> torch.Tensor:
    return x.float().relu().square().to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.silu(x.float()).to(x.dtype)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return x.float().sigmoid().to(x.dtype)


def gated(activation_name: str, x: torch.Tensor) -> torch.Tensor:
    """TE's gated activations: the activation of the input's first half times its second half
    (PyTorch's GLU gates the second half instead)."""
    gate, linear = x.float().chunk(2, dim=-1)
    return (ACTIVATIONS[activation_name](gate) * linear).to(x.dtype)


def clamped_swiglu(x: torch.Tensor, limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """GPT-OSS's SwiGLU, as TE's ClampedSwiGLU computes it with its defaults."""
    import torch

    gate, linear = x.float().chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (linear.clamp(-limit, limit) + 1.0)).to(x.dtype)


def situ_glu(x: torch.Tensor, beta1: float = 4.0, beta2: float = 25.0) -> torch.Tensor:
    """Kimi K3's SiTU-GLU, as TE's SiTUGLU computes it with its defaults."""
    import torch

    gate, linear = x.float().chunk(2, dim=-1)
    return (beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate) * beta2 * torch.tanh(linear / beta2)).to(x.dtype)


def tanh_srelu(x: torch.Tensor, cap: float) -> torch.Tensor:
    """ScaledTanhSReLU before its scales: relu soft-clamped by tanh at `cap`, squared."""
    import torch

    return (cap * torch.tanh(x.float().relu() / cap)).square().to(x.dtype)


def row_scaled(y: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Each row of `y` times its scale (the grouped MLP's scaled activations), stored once."""
    return (y.float() * scales.float().unsqueeze(-1)).to(y.dtype)


ACTIVATIONS = {"gelu": gelu, "qgelu": qgelu, "relu": relu, "srelu": srelu, "silu": silu, "sigmoid": sigmoid}


def add_in_place(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x + residual, also accumulated into the caller's residual buffer, as
    AddExtraInput(in_place=True) does by design; gradients flow to both."""
    total = x + residual
    residual.detach().add_(x.detach())
    return total
