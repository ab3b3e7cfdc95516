"""The CPU backend's SiTU-GLU and scaled GLU kernels (harness/targets/cpu_backend/glu_kernels.py)
against autograd on plain-torch formulas written here from TE's docstrings, in every dtype TE
supports, with the block interleave and the scales' gradient; and the comparison seen failing
against a broken kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.targets.cpu_backend import glu_kernels as g
from harness.targets.cpu_backend.kernels import KERNELS

TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
       torch.float16: {"rtol": 1e-3, "atol": 1e-3}}


def _situ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 4.0 * torch.tanh(a / 4.0) * torch.sigmoid(a) * (25.0 * torch.tanh(b / 25.0))


def _swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def _clamped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.minimum(a, torch.tensor(7.0))
    return c * torch.sigmoid(1.702 * c) * (torch.clamp(b, -7.0, 7.0) + 1.0)


def _split(x: torch.Tensor, interleave: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and value by column index: blocks of `interleave` alternate (0: the two halves)."""
    width = x.shape[-1]
    block = interleave or width // 2
    columns = torch.arange(width)
    is_gate = (columns // block) % 2 == 0
    return x[..., columns[is_gate]], x[..., columns[~is_gate]]


FORMS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], tuple[Any, ...]]] = {
    "swiglu": (_swiglu, g.scaled_swiglu, g.scaled_dswiglu, ()),
    "situglu": (_situ, g.scaled_situglu, g.scaled_dsituglu, (4.0, 25.0)),
    "clamped": (_clamped, g.scaled_clamped_swiglu, g.scaled_clamped_dswiglu, (7.0, 1.702, 1.0)),
}


def _check(form: str, dtype: torch.dtype, interleave: int, forward: Callable[..., Any] | None = None,
           backward: Callable[..., Any] | None = None) -> None:
    math, fwd, bwd, extra = FORMS[form]
    fwd, bwd = forward or fwd, backward or bwd
    gen = torch.Generator().manual_seed(7)
    x = (3 * torch.randn(6, 16, generator=gen)).to(dtype)
    x[0, :2] = 9.0  # beyond the clamp limit and the soft caps' linear range
    scales = torch.rand(6, generator=gen).to(dtype) + 0.5
    dy = torch.randn(6, 8, generator=gen).to(dtype)
    xr, sr = x.double().requires_grad_(), scales.double().requires_grad_()
    a, b = _split(xr, interleave)
    y_ref = math(a, b) * sr.unsqueeze(-1)
    y_ref.backward(dy.double())
    y = fwd(x, scales, None, *extra, interleave)
    dx, dscales = bwd(dy, x, scales, None, *extra, interleave, True)
    torch.testing.assert_close(y.double(), y_ref.detach(), **TOL[dtype])
    torch.testing.assert_close(dx.double(), xr.grad, **TOL[dtype])
    torch.testing.assert_close(dscales.double(), sr.grad, **TOL[dtype])
    assert y.dtype == dx.dtype == dtype and bwd(dy, x, scales, None, *extra, interleave, False)[1] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleave", [0, 2])
@pytest.mark.parametrize("form", list(FORMS))
def test_scaled_glu_matches_autograd(form: str, dtype: torch.dtype, interleave: int) -> None:
    _check(form, dtype, interleave)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_situglu_matches_autograd(dtype: torch.dtype) -> None:
    x = (3 * torch.randn(5, 12)).to(dtype)
    dy = torch.randn(5, 6).to(dtype)
    xr = x.double().requires_grad_()
    a, b = xr.chunk(2, dim=-1)
    y_ref = _situ(a, b)
    y_ref.backward(dy.double())
    torch.testing.assert_close(g.situglu(x, None, 4.0, 25.0).double(), y_ref.detach(), **TOL[dtype])
    torch.testing.assert_close(g.dsituglu(dy, x, None, 4.0, 25.0).double(), xr.grad, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scaled_srelu_matches_autograd(dtype: torch.dtype) -> None:
    x, scales, dy = torch.randn(5, 8).to(dtype), (torch.rand(5) + 0.5).to(dtype), torch.randn(5, 8).to(dtype)
    xr, sr = x.double().requires_grad_(), scales.double().requires_grad_()
    y_ref = torch.relu(xr).square() * sr.unsqueeze(-1)
    y_ref.backward(dy.double())
    dx, dscales = g.scaled_dsrelu(dy, x, scales, None, True)
    torch.testing.assert_close(g.scaled_srelu(x, scales, None).double(), y_ref.detach(), **TOL[dtype])
    torch.testing.assert_close(dx.double(), xr.grad, **TOL[dtype])
    torch.testing.assert_close(dscales.double(), sr.grad, **TOL[dtype])


def test_the_comparison_catches_a_broken_glu_kernel() -> None:
    def no_scale_in_backward(dy: Any, x: Any, scales: Any, q: Any, interleave: int = 0, want: bool = False) -> Any:
        return g.glu_backward(g.swiglu_math(), dy, x, None, interleave, False)[0], torch.zeros_like(scales)

    def halves_ignore_interleave(x: Any, scales: Any, q: Any, interleave: int = 0) -> Any:
        return g.scaled_swiglu(x, scales, q, 0)

    with pytest.raises(AssertionError):
        _check("swiglu", torch.float32, 0, backward=no_scale_in_backward)
    with pytest.raises(AssertionError):
        _check("swiglu", torch.float32, 2, forward=halves_ignore_interleave)


def test_the_extension_stand_in_exposes_them_and_refuses_a_quantizer() -> None:
    assert {"situglu", "dsituglu", "scaled_swiglu", "scaled_dswiglu", "scaled_situglu", "scaled_clamped_dswiglu"} \
        <= set(KERNELS)
    with pytest.raises(NotImplementedError, match="FP8"):
        g.situglu(torch.ones(2, 4), object())
