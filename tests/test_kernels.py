"""The kernel stand-ins (cpu_backend/kernels.py) against plain torch.

The references are `torch.nn.functional.rms_norm`/`layer_norm`, matmuls and torch's own
activations in float32, differentiated by autograd; the kernels' outputs, statistics and
gradients must match them in float32 and bfloat16 (the norms with and without zero-centred
gamma; the GEMM in the three layouts BasicLinear uses, with its bias epilogues). `test_comparison_catches_broken_kernel`
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


# --- GEMM (`generic_gemm`, as `cpp_extensions.general_gemm` calls it) and the activations ---

def _gemm(kernel: Callable[..., Any], a: torch.Tensor, b: torch.Tensor, layout: str, *, bias: torch.Tensor | None = None,
          grad: bool = False, out: torch.Tensor | None = None, accumulate: bool = False) -> tuple[Any, ...]:
    """The positional arguments general_gemm passes (2.1 to 2.20), alpha/beta as keywords."""
    return kernel(a, layout[0] == "T", b, layout[1] == "T", out, None, None, bias, kernels.DType.kFloat32, False,
                  None, grad, torch.empty(0, dtype=torch.uint8), 0, accumulate, False, comm_overlap=None,
                  comm_type=None, extra_output=None, bulk_overlap=False, alpha=1.0, beta=None)


def _compare_gemm(kernel: Callable[..., Any], dtype: torch.dtype) -> None:
    """What BasicLinear asks for: forward "TN", data gradient "NN", weight gradient "NT"
    (accumulated into a given buffer), and the bias epilogues of the fused linear ops."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 8, generator=g).to(dtype)  # a leading batch dimension, flattened by the kernel
    w = torch.randn(5, 8, generator=g).to(dtype)
    dy = torch.randn(2, 3, 5, generator=g).to(dtype)
    bias = torch.randn(5, generator=g).to(dtype)
    tol = TOLERANCES[dtype]
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    y_ref = xr @ wr.t() + bias.float()
    y_ref.backward(dy.float())
    y, *_ = _gemm(kernel, w, x, "TN", bias=bias)
    torch.testing.assert_close(y, y_ref.detach().to(dtype), **tol)
    dx, *_ = _gemm(kernel, w, dy, "NN")
    torch.testing.assert_close(dx, xr.grad.to(dtype), **tol)
    start = torch.randn(5, 8, generator=g).to(dtype)
    dw_buffer = start.clone()
    dw, db, *_ = _gemm(kernel, x.reshape(-1, 8), dy.reshape(-1, 5), "NT", bias=bias, grad=True, out=dw_buffer,
                       accumulate=True)
    assert dw is dw_buffer
    torch.testing.assert_close(dw, (start.float() + wr.grad).to(dtype), **tol)
    torch.testing.assert_close(db, dy.float().sum((0, 1)).to(dtype), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gemm_matches_plain_torch(dtype: torch.dtype) -> None:
    _compare_gemm(kernels.generic_gemm, dtype)


def _gemm_mixes_rows(*args: Any, **kwargs: Any) -> Any:
    """Flattens B's leading dimensions in the wrong order: the same shape, wrong rows."""
    args = list(args)
    if args[2].dim() == 3:
        args[2] = args[2].transpose(0, 1).reshape(args[2].shape)
    return kernels.generic_gemm(*args, **kwargs)


def _gemm_ignores_accumulate(*args: Any, **kwargs: Any) -> Any:
    args = list(args)
    args[14] = False
    return kernels.generic_gemm(*args, **kwargs)


def _gemm_drops_bias(*args: Any, **kwargs: Any) -> Any:
    args = list(args)
    if not args[11]:
        args[7] = None
    return kernels.generic_gemm(*args, **kwargs)


@pytest.mark.parametrize("broken", [_gemm_mixes_rows, _gemm_ignores_accumulate, _gemm_drops_bias],
                         ids=["mixes_rows", "ignores_accumulate", "drops_bias"])
def test_gemm_comparison_catches_broken_kernel(broken: Callable[..., Any]) -> None:
    with pytest.raises(AssertionError):
        _compare_gemm(broken, torch.float32)


# TE's activations and the torch functions they compute (GELU in the tanh approximation).
ACTIVATION_REFERENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x) ** 2,
    "glu": lambda x: torch.sigmoid(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    "geglu": lambda x: F.gelu(x.chunk(2, -1)[0], approximate="tanh") * x.chunk(2, -1)[1],
    "reglu": lambda x: F.relu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    "swiglu": lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    "qgeglu": lambda x: x.chunk(2, -1)[0] * torch.sigmoid(1.702 * x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    "sreglu": lambda x: F.relu(x.chunk(2, -1)[0]) ** 2 * x.chunk(2, -1)[1],
}


def _compare_activation(name: str, dtype: torch.dtype, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, generator=g).to(dtype)
    dy = torch.randn(4, 16 if name in ("gelu", "relu", "silu", "qgelu", "srelu") else 8, generator=g).to(dtype)
    xr = x.float().requires_grad_()
    y_ref = ACTIVATION_REFERENCES[name](xr)
    y_ref.backward(dy.float())
    torch.testing.assert_close(fwd(x, None), y_ref.detach().to(dtype), **TOLERANCES[dtype])
    torch.testing.assert_close(bwd(dy, x, None), xr.grad.to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(ACTIVATION_REFERENCES))
def test_activation_matches_autograd(name: str, dtype: torch.dtype) -> None:
    assert set(ACTIVATION_REFERENCES) | {f"d{n}" for n in ACTIVATION_REFERENCES} == set(kernels.ACTIVATION_KERNELS)
    _compare_activation(name, dtype, kernels.ACTIVATION_KERNELS[name], kernels.ACTIVATION_KERNELS[f"d{name}"])


@pytest.mark.parametrize("name", ["gelu", "swiglu", "srelu"])
def test_activation_comparison_catches_broken_kernel(name: str) -> None:
    fwd, bwd = kernels.ACTIVATION_KERNELS[name], kernels.ACTIVATION_KERNELS[f"d{name}"]
    with pytest.raises(AssertionError):  # a backward that forgets the chain rule's dy
        _compare_activation(name, torch.float32, fwd, lambda dy, x, q: bwd(torch.ones_like(dy), x, q))
    with pytest.raises(AssertionError):  # GELU's exact form where TE uses the tanh approximation, etc.
        _compare_activation(name, torch.float32, lambda x, q: fwd(x * 1.01, q), bwd)


def test_rmsnorm_bwd_add_adds_the_extra_gradient() -> None:
    t = _tensors(torch.float32, False)
    _, _, rsigma = kernels.rmsnorm_fwd(t["x"], t["weight"], EPS, None, None, kernels.DType.kFloat32, 0, False)
    add = torch.randn_like(t["x"])
    dx, dw = kernels.rmsnorm_bwd_add(t["dy"], t["x"], add, rsigma, t["weight"], 0, False)
    ref = _reference("rmsnorm", t, False)
    torch.testing.assert_close(dx, ref["dx"] + add)
    torch.testing.assert_close(dw, ref["dw"])


def test_rmsnorm_bwd_add_rounds_once_in_low_precision() -> None:
    """TE's kernel adds the extra gradient to dx in float32 and stores once; rounding dx to
    bfloat16 first, then adding, differs from it in the last bit for some elements."""
    t = _tensors(torch.bfloat16, False)
    _, _, rsigma = kernels.rmsnorm_fwd(t["x"], t["weight"], EPS, None, None, kernels.DType.kBFloat16, 0, False)
    add = (torch.randn(ROWS, HIDDEN, generator=torch.Generator().manual_seed(5)) * 3).to(torch.bfloat16)
    dx, _ = kernels.rmsnorm_bwd_add(t["dy"], t["x"], add, rsigma, t["weight"], 0, False)
    dx_float, _ = kernels._rmsnorm_bwd_float(t["dy"], t["x"], rsigma, t["weight"], False)
    once = (dx_float + add.float()).to(torch.bfloat16)
    torch.testing.assert_close(dx, once, rtol=0, atol=0)
    twice = (dx_float.to(torch.bfloat16).float() + add.float()).to(torch.bfloat16)
    with pytest.raises(AssertionError):  # the stand-in's old double rounding is caught by the same comparison
        torch.testing.assert_close(twice, once, rtol=0, atol=0)


def _clamped_swiglu_reference(x: torch.Tensor, limit: float, alpha: float, offset: float) -> torch.Tensor:
    gate, linear = x.chunk(2, -1)
    gate = gate.clamp(max=limit)
    return gate * torch.sigmoid(alpha * gate) * (linear.clamp(-limit, limit) + offset)


def _compare_clamped_swiglu(dtype: torch.dtype, fwd: Callable[..., Any], bwd: Callable[..., Any],
                            offset: float) -> None:
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(8, 32, generator=g) * 6).to(dtype)  # beyond the limit on both sides
    dy = torch.randn(8, 16, generator=g).to(dtype)
    xr = x.float().requires_grad_()
    y_ref = _clamped_swiglu_reference(xr, 7.0, 1.702, offset)
    y_ref.backward(dy.float())
    torch.testing.assert_close(fwd(x, None, 7.0, 1.702, offset), y_ref.detach().to(dtype), **TOLERANCES[dtype])
    torch.testing.assert_close(bwd(dy, x, None, 7.0, 1.702, offset), xr.grad.to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("offset", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_clamped_swiglu_matches_autograd(dtype: torch.dtype, offset: float) -> None:
    _compare_clamped_swiglu(dtype, kernels.clamped_swiglu, kernels.clamped_dswiglu, offset)


def test_clamped_swiglu_comparison_catches_broken_kernel() -> None:
    def no_clamp_in_backward(dy: torch.Tensor, x: torch.Tensor, q: Any, limit: float, alpha: float,
                             offset: float) -> torch.Tensor:
        return kernels.clamped_dswiglu(dy, x, q, float("inf"), alpha, offset)

    def offset_ignored(x: torch.Tensor, q: Any, limit: float, alpha: float, offset: float) -> torch.Tensor:
        return kernels.clamped_swiglu(x, q, limit, alpha)

    with pytest.raises(AssertionError):
        _compare_clamped_swiglu(torch.float32, kernels.clamped_swiglu, no_clamp_in_backward, 1.0)
    with pytest.raises(AssertionError):
        _compare_clamped_swiglu(torch.float32, offset_ignored, kernels.clamped_dswiglu, 0.5)


def _check_dropout(dtype: torch.dtype, p: float, bwd: Callable[..., Any]) -> None:
    """Each output element is 0 or x / (1 - p) (in float32, stored once), the mask's bits say
    which, the share dropped is floor(p * 256) / 256 within five standard deviations, and the
    backward applies the same mask and scale."""
    from harness.targets.cpu_backend import device

    device.cuda_generator().manual_seed(7)
    x = (torch.rand(64, 256, generator=torch.Generator().manual_seed(2)) + 0.5).to(dtype)  # never 0
    y, mask = kernels.dropout_fwd(x, p)
    assert mask.dtype == torch.uint8 and mask.numel() == x.numel() // 8
    keep = ((mask.to(torch.int32).unsqueeze(-1) >> torch.arange(8)) & 1).reshape(x.shape).bool()
    scale = 1 / (1 - p)
    torch.testing.assert_close(y, torch.where(keep, (x.float() * scale).to(dtype), torch.zeros_like(x)), rtol=0, atol=0)
    dropped, expected = 1 - keep.float().mean().item(), int(p * 256) / 256
    assert abs(dropped - expected) < 5 * (expected * (1 - expected) / x.numel()) ** 0.5 + 1e-9
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    expected_dx = torch.where(keep, (dy.float() * scale).to(dtype), torch.zeros_like(dy))
    torch.testing.assert_close(bwd(dy, mask, p), expected_dx, rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dropout_keeps_what_its_mask_says(dtype: torch.dtype, p: float) -> None:
    _check_dropout(dtype, p, kernels.dropout_bwd)


def test_dropout_is_seeded_by_the_cuda_generator_and_refuses_odd_sizes() -> None:
    from harness.targets.cpu_backend import device

    x = torch.ones(4, 16, dtype=torch.bfloat16)
    device.cuda_generator().manual_seed(1)
    first = kernels.dropout_fwd(x, 0.5)[1]
    device.cuda_generator().manual_seed(1)
    assert torch.equal(first, kernels.dropout_fwd(x, 0.5)[1])
    with pytest.raises(ValueError, match="divisible by 16"):
        kernels.dropout_fwd(torch.ones(3, 5, dtype=torch.bfloat16), 0.5)


def test_dropout_check_catches_broken_kernel() -> None:
    def bits_reversed(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
        reversed_mask = ((mask.to(torch.int32).unsqueeze(-1) >> torch.arange(8)) & 1).flip(-1)
        return kernels.dropout_bwd(dy, (reversed_mask * 2 ** torch.arange(8)).sum(-1).to(torch.uint8), p)

    with pytest.raises(AssertionError):
        _check_dropout(torch.bfloat16, 0.5, bits_reversed)


def _grouped(grouped_gemm: Callable[..., Any], dtype: torch.dtype, single_output: bool,
             with_bias: bool) -> None:
    """The forward layout GroupedLinear uses ("TN": weights A[i], inputs B[i] split by rows), each
    group against its own matmul; with a bias, added forward, and its gradient in the "NT"
    (weight gradient) layout."""
    g = torch.Generator().manual_seed(4)
    splits, k, n = [3, 0, 5], 16, 8
    x = torch.randn(sum(splits), k, generator=g).to(dtype)
    inputs = list(x.split(splits))
    weights = [torch.randn(n, k, generator=g).to(dtype) for _ in splits]
    biases = [torch.randn(n, generator=g).to(dtype) if with_bias else torch.empty(0, dtype=dtype) for _ in splits]
    out = [torch.empty(sum(splits), n, dtype=dtype)] if single_output else [torch.empty(m, n, dtype=dtype) for m in splits]
    otype = {torch.float32: kernels.DType.kFloat32, torch.bfloat16: kernels.DType.kBFloat16}[dtype]
    grouped_gemm(weights, True, inputs, False, out, otype, splits, biases, otype, single_output,
                 [torch.empty(0)] * 3, False, [torch.empty(1)], 1, False, False, 0)
    results = out[0].split(splits) if single_output else out
    for i in range(len(splits)):
        expected = inputs[i].float() @ weights[i].float().t() + (biases[i].float() if with_bias else 0)
        torch.testing.assert_close(results[i], expected.to(dtype), **TOLERANCES[dtype])
    if with_bias:  # the weight gradient: dW[i] = dy[i]^T x[i], the bias gradient the column sum of dy[i]
        dys = [torch.randn(m, n, generator=g).to(dtype) for m in splits]
        dw = [torch.empty(n, k, dtype=dtype) for _ in splits]
        dbias = [torch.empty(n, dtype=dtype) for _ in splits]
        grouped_gemm(inputs, False, dys, True, dw, otype, splits, dbias, otype, False,
                     [torch.empty(0)] * 3, True, [torch.empty(1)], 1, False, False, 0)
        for i in range(len(splits)):
            torch.testing.assert_close(dw[i], (dys[i].float().t() @ inputs[i].float()).to(dtype), **TOLERANCES[dtype])
            torch.testing.assert_close(dbias[i], dys[i].float().sum(0).to(dtype), **TOLERANCES[dtype])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("single_output", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_gemm_matches_each_groups_matmul(dtype: torch.dtype, single_output: bool, with_bias: bool) -> None:
    _grouped(kernels.te_general_grouped_gemm, dtype, single_output, with_bias)


def test_grouped_gemm_comparison_catches_broken_kernel() -> None:
    def groups_swapped(A: list[torch.Tensor], *args: Any) -> Any:
        return kernels.te_general_grouped_gemm([A[-1], *A[1:-1], A[0]], *args)

    def bias_gradient_left_out(*args: Any) -> Any:
        args = list(args)
        args[7] = [torch.empty(0)] * len(args[7]) if args[11] else args[7]
        return kernels.te_general_grouped_gemm(*args)

    with pytest.raises(AssertionError):
        _grouped(groups_swapped, torch.float32, False, False)
    with pytest.raises(AssertionError):
        _grouped(bias_gradient_left_out, torch.float32, False, True)


def _grouped_dbias_case(kernel: Callable[..., Any], has_scales: bool) -> None:
    """TE's Triton `_grouped_dbias_kernel` stand-in against per-group sums, accumulating into
    the given buffers as the kernel's atomic adds do."""
    from harness.targets.cpu_backend import triton_kernels  # noqa: F401 (the module under test)

    g = torch.Generator().manual_seed(9)
    splits, hidden = [4, 0, 3], 8
    dy = torch.randn(sum(splits), hidden, generator=g).to(torch.bfloat16)
    offsets = torch.tensor([0, 4, 4, 7])
    scales, bias = torch.rand(sum(splits), generator=g), torch.randn(3, hidden, generator=g)
    dbias, dscales = torch.ones(3, hidden), torch.ones(sum(splits))
    kernel[(3, 4, 1)](dy, dbias, offsets, scales if has_scales else dy, bias if has_scales else dy,
                      dscales if has_scales else dy, hidden, HAS_SCALES=has_scales, N_ROW_SPLITS=4,
                      BLOCK_M=128, BLOCK_H=128, num_warps=4, num_stages=2)
    rows = dy.float().split(splits)
    weights = scales.split(splits) if has_scales else [torch.ones(m) for m in splits]
    expected = torch.stack([(r * w.unsqueeze(-1)).sum(0) for r, w in zip(rows, weights)]) + 1
    torch.testing.assert_close(dbias, expected)
    if has_scales:
        group_of_row = torch.repeat_interleave(torch.arange(3), torch.tensor(splits))
        torch.testing.assert_close(dscales, (dy.float() * bias[group_of_row]).sum(-1) + 1)


@pytest.mark.parametrize("has_scales", [False, True])
def test_triton_grouped_dbias_matches_per_group_sums(has_scales: bool) -> None:
    from harness.targets.cpu_backend import triton_kernels

    _grouped_dbias_case(triton_kernels.Launch("_grouped_dbias_kernel", triton_kernels.KERNELS["_grouped_dbias_kernel"]),
                        has_scales)


def test_triton_grouped_dbias_check_catches_broken_kernel() -> None:
    from harness.targets.cpu_backend import triton_kernels

    def overwrites(dy: torch.Tensor, dbias: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        dbias.zero_()  # writes where the kernel accumulates
        triton_kernels.grouped_dbias_kernel(dy, dbias, *args, **kwargs)

    with pytest.raises(AssertionError):
        _grouped_dbias_case(triton_kernels.Launch("broken", overwrites), False)
