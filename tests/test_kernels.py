"""The kernel stand-ins (cpu_backend/kernels.py) against plain torch's own norms.

The reference is `torch.nn.functional.rms_norm`/`layer_norm` in float32, differentiated
by autograd; the kernels' outputs, statistics and gradients must match it in float32 and
bfloat16, with and without zero-centred gamma. `test_comparison_catches_broken_kernel`
runs the same comparison on deliberately broken kernels and requires it to fail, so a
comparison that cannot fail would be caught here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from harness.engine.checks import TOLERANCES
from harness.targets.cpu_backend import kernels

EPS = 1e-5
ROWS, HIDDEN = 6, 32


def _tensors(dtype: torch.dtype, zero_centered: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    make = lambda *shape, scale=1.0: (torch.randn(*shape, generator=generator) * scale).to(dtype)
    return {
        "x": make(ROWS, HIDDEN) + 0.3,
        "weight": make(HIDDEN, scale=0.2) + (0.0 if zero_centered else 1.0),
        "bias": make(HIDDEN, scale=0.2),
        "dy": make(ROWS, HIDDEN),
    }


def _reference(norm: str, t: dict[str, torch.Tensor], zero_centered: bool) -> dict[str, torch.Tensor]:
    """Plain torch in float32, with autograd for the gradients."""
    x = t["x"].float().requires_grad_()
    w = t["weight"].float().requires_grad_()
    b = t["bias"].float().requires_grad_()
    gamma = w + 1 if zero_centered else w
    if norm == "rmsnorm":
        y = F.rms_norm(x, (HIDDEN,), gamma, EPS)
        rsigma = torch.rsqrt(x.detach().pow(2).mean(-1) + EPS)
    else:
        y = F.layer_norm(x, (HIDDEN,), gamma, b, EPS)
        rsigma = torch.rsqrt(x.detach().var(-1, unbiased=False) + EPS)
    y.backward(t["dy"].float())
    dtype = t["x"].dtype
    grads = {"dx": x.grad.to(dtype), "dw": w.grad.to(dtype)}
    if b.grad is not None:
        grads["db"] = b.grad.to(dtype)
    return {"y": y.detach().to(dtype), "rsigma": rsigma, **grads}


def _run_kernels(norm: str, t: dict[str, torch.Tensor], zero_centered: bool, fwd: Callable[..., Any],
                 bwd: Callable[..., Any]) -> dict[str, torch.Tensor]:
    """Call the kernels the way TE's ops do (ops/basic/rmsnorm.py, layer_norm.py)."""
    otype = kernels.DType.kFloat32 if t["x"].dtype == torch.float32 else kernels.DType.kBFloat16
    if norm == "rmsnorm":
        y, mu, rsigma = fwd(t["x"], t["weight"], EPS, None, None, otype, 0, zero_centered)
        assert mu is None
        dx, dw = bwd(t["dy"], t["x"], rsigma, t["weight"], 0, zero_centered)
        return {"y": y, "rsigma": rsigma, "dx": dx, "dw": dw}
    y, mu, rsigma = fwd(t["x"], t["weight"], t["bias"], EPS, None, None, otype, 0, zero_centered)
    torch.testing.assert_close(mu, t["x"].float().mean(-1))
    dx, dw, db = bwd(t["dy"], t["x"], mu, rsigma, t["weight"], 0, zero_centered)
    return {"y": y, "rsigma": rsigma, "dx": dx, "dw": dw, "db": db}


def _compare(norm: str, dtype: torch.dtype, zero_centered: bool, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
    t = _tensors(dtype, zero_centered)
    actual = _run_kernels(norm, t, zero_centered, fwd, bwd)
    expected = _reference(norm, t, zero_centered)
    for name, value in actual.items():
        assert value.dtype == expected[name].dtype, f"{name}: {value.dtype} != {expected[name].dtype}"
        torch.testing.assert_close(value, expected[name], **TOLERANCES[expected[name].dtype], msg=lambda m, name=name: f"{name}: {m}")


KERNEL_PAIRS = {
    "rmsnorm": (kernels.rmsnorm_fwd, kernels.rmsnorm_bwd),
    "layernorm": (kernels.layernorm_fwd, kernels.layernorm_bwd),
}


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered_gamma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("norm", list(KERNEL_PAIRS))
def test_kernel_matches_plain_torch(norm: str, dtype: torch.dtype, zero_centered: bool) -> None:
    _compare(norm, dtype, zero_centered, *KERNEL_PAIRS[norm])


def _wrong_eps(fwd: Callable[..., Any]) -> Callable[..., Any]:
    def broken(x: torch.Tensor, w: torch.Tensor, *args: Any) -> Any:
        args = list(args)
        eps_at = 0 if fwd is kernels.rmsnorm_fwd else 1  # layernorm_fwd has the bias first
        args[eps_at] = 0.5
        return fwd(x, w, *args)
    return broken


def _ignores_zero_centered(kernel: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: kernel(*args[:-1], False)


def _drops_projection(norm: str) -> Callable[..., Any]:
    """A backward that forgets the normalisation's own derivative: dx = rsigma * dy * gamma."""
    def broken(dz: torch.Tensor, x: torch.Tensor, *args: Any) -> Any:
        rsigma, gamma, zero_centered = args[-4], args[-3], args[-1]
        grads = KERNEL_PAIRS[norm][1](dz, x, *args)
        dx = (dz.float() * rsigma.unsqueeze(-1) * (gamma.float() + (1 if zero_centered else 0))).to(x.dtype)
        return (dx, *grads[1:])
    return broken


BREAKAGES = {
    "wrong_eps_forward": lambda norm: (_wrong_eps(KERNEL_PAIRS[norm][0]), KERNEL_PAIRS[norm][1]),
    "forward_ignores_zero_centered": lambda norm: (_ignores_zero_centered(KERNEL_PAIRS[norm][0]), KERNEL_PAIRS[norm][1]),
    "backward_ignores_zero_centered": lambda norm: (KERNEL_PAIRS[norm][0], _ignores_zero_centered(KERNEL_PAIRS[norm][1])),
    "backward_drops_projection": lambda norm: (KERNEL_PAIRS[norm][0], _drops_projection(norm)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("breakage", list(BREAKAGES))
@pytest.mark.parametrize("norm", list(KERNEL_PAIRS))
def test_comparison_catches_broken_kernel(norm: str, breakage: str, dtype: torch.dtype) -> None:
    fwd, bwd = BREAKAGES[breakage](norm)
    with pytest.raises(AssertionError):
        _compare(norm, dtype, True, fwd, bwd)


def test_quantized_output_is_refused() -> None:
    t = _tensors(torch.float32, False)
    with pytest.raises(NotImplementedError, match="FP8"):
        kernels.rmsnorm_fwd(t["x"], t["weight"], EPS, None, object(), kernels.DType.kFloat32, 0, False)


def test_output_buffer_is_written() -> None:
    """TE passes `ln_out` to have the kernel write into a given buffer."""
    t = _tensors(torch.float32, False)
    buffer = torch.empty_like(t["x"])
    y, _, _ = kernels.rmsnorm_fwd(t["x"], t["weight"], EPS, buffer, None, kernels.DType.kFloat32, 0, False)
    assert y is buffer
    torch.testing.assert_close(buffer, _reference("rmsnorm", t, False)["y"])
