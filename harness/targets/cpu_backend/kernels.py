"""Plain-torch stand-ins for the compiled kernels TE's ops reach on the unquantized path.

TE's own ops and modules (`ops/basic/*.py`, `module/*.py`, the fused ops) call functions of
the compiled extension `transformer_engine_torch`: the GEMM (`generic_gemm`, through
`cpp_extensions.general_gemm`), the activations and their backward, and the norms. These
have the extension's signatures (the same from 2.1 to 2.20 for the arguments the Python
side passes; `generic_gemm` took `alpha`/`beta` from 2.5 on, as keywords) and return the same
tuples, so the ops run as shipped; only the arithmetic below is ours. As in TE's kernels,
statistics and activations are computed in float32 and cast to the output dtype.

A `quantizer` (an FP8 output) is refused with `NotImplementedError`: the CPU backend is a
device without FP8 (`device.py`), so TE only builds quantizers when a test asks for FP8.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import torch

from harness.targets.cpu_backend.glu_kernels import GLU_KERNELS


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


def _rmsnorm_bwd_float(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                       zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dgamma) in float32, before the store."""
    dy, r = dz.float(), rsigma.float().unsqueeze(-1)
    x_hat = x.float() * r
    g = dy * _gamma(gamma, zero_centered_gamma)
    return r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True)), (dy * x_hat).sum(0)


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                sm_margin: int, zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dx, dgamma) in the dtypes of x and gamma."""
    dx, dgamma = _rmsnorm_bwd_float(dz, x, rsigma, gamma, zero_centered_gamma)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


def rmsnorm_bwd_add(dz: torch.Tensor, x: torch.Tensor, add: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                    sm_margin: int, zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm's backward with a gradient added to dx (the fused op BackwardAddRMSNorm, 2.11 on):
    as TE's kernel, the sum is taken in float32 and stored once (never dx rounded, then added)."""
    dx, dgamma = _rmsnorm_bwd_float(dz, x, rsigma, gamma, zero_centered_gamma)
    return (dx + add.float()).to(x.dtype), dgamma.to(gamma.dtype)


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


def _dtype_of(otype: Any, default: torch.dtype) -> torch.dtype:
    return default if otype is None else _out_dtype(otype)


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """The extension treats a tensor as 2-D: every dimension but the last flattened."""
    return t.reshape(-1, t.shape[-1]) if t.dim() != 1 else t.reshape(1, -1)


def generic_gemm(A: torch.Tensor, transa: bool, B: torch.Tensor, transb: bool, out: torch.Tensor | None,
                 quantizer: Any, out_dtype: Any, bias: torch.Tensor | None, bias_type: Any, gelu: bool,
                 gelu_in: torch.Tensor | None, grad: bool, workspace: torch.Tensor, workspace_size: int,
                 accumulate: bool, use_split_accumulator: bool, comm_overlap: Any = None, comm_type: Any = None,
                 extra_output: torch.Tensor | None = None, bulk_overlap: bool = False, alpha: float = 1.0,
                 beta: float | None = None) -> tuple[Any, ...]:
    """cuBLAS's column-major D = op(A) op(B), i.e. row-major `op(B) @ op(A)`: with layout "TN"
    (A the weight, B the input) the forward, "NN" the data gradient, "NT" the weight gradient.

    Epilogues, as the extension applies them: forward `bias` is added (and with `gelu` the
    pre-activation returned beside GELU's output); with `grad`, the bias gradient is the
    column sum of B, and `gelu` multiplies by GELU's derivative at `gelu_in`.
    Returns (D, bias_grad, pre_gelu_out, extra_output)."""
    _no_quantizer(quantizer)
    if comm_overlap is not None:
        raise NotImplementedError("GEMM with communication overlap is not available on the CPU backend")
    a, b = _matrix(A).float(), _matrix(B).float()
    d = (b.t() if transb else b) @ (a.t() if transa else a)
    shape = ([B.shape[-1]] if transb else list(B.shape[:-1])) + [A.shape[0] if transa else A.shape[-1]]
    d = (d * alpha).reshape(shape)
    bias_grad = pre_gelu = None
    if grad:
        if gelu:
            d = _dgelu_math(d, gelu_in.float()) if gelu_in is not None else d
        if bias is not None:
            bias_grad = b.sum(0).to(_dtype_of(out_dtype, A.dtype))
    else:
        if bias is not None:
            d = d + bias.float()
        if gelu:
            pre_gelu = d.to(_dtype_of(out_dtype, A.dtype))
            d = _gelu_math(d)
    dtype = out.dtype if out is not None else _dtype_of(out_dtype, A.dtype)
    if out is None:
        return d.to(dtype), bias_grad, pre_gelu, extra_output
    if accumulate:
        d = d + out.float() * (1.0 if beta is None else beta)
    out.copy_(d.reshape(out.shape))
    return out, bias_grad, pre_gelu, extra_output


def _gelu_math(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _dgelu_math(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy * GELU'(x), the tanh approximation TE's kernels use."""
    k, c = 0.7978845608028654, 0.044715
    inner = torch.tanh(k * (x + c * x.pow(3)))
    return dy * (0.5 * (1 + inner) + 0.5 * x * (1 - inner.pow(2)) * k * (1 + 3 * c * x.pow(2)))


# Elementwise activations: forward math and derivative, both on float32.
_ACTIVATIONS: dict[str, tuple[Any, Any]] = {
    "gelu": (_gelu_math, lambda x: _dgelu_math(torch.ones_like(x), x)),
    "relu": (torch.relu, lambda x: (x > 0).float()),
    "silu": (torch.nn.functional.silu, lambda x: torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))),
    "qgelu": (lambda x: x * torch.sigmoid(1.702 * x),
              lambda x: torch.sigmoid(1.702 * x) * (1 + 1.702 * x * (1 - torch.sigmoid(1.702 * x)))),
    "srelu": (lambda x: torch.relu(x).pow(2), lambda x: 2 * torch.relu(x)),
}
# Gated forms: the first half of the last dimension goes through the activation and
# multiplies the second half (TE's `glu` is sigmoid-gated, `swiglu` silu-gated, ...).
_GATED = {"glu": "sigmoid", "geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu", "sreglu": "srelu"}
_ACTIVATIONS["sigmoid"] = (torch.sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)))


def _activation(name: str) -> tuple[Any, Any]:
    act, dact = _ACTIVATIONS[name]

    def forward(input: torch.Tensor, quantizer: Any) -> torch.Tensor:
        _no_quantizer(quantizer)
        return act(input.float()).to(input.dtype)

    def backward(grad: torch.Tensor, input: torch.Tensor, quantizer: Any) -> torch.Tensor:
        _no_quantizer(quantizer)
        return (grad.float() * dact(input.float())).to(input.dtype)

    forward.__name__, backward.__name__ = name, f"d{name}"
    return forward, backward


def _gated(name: str, base: str) -> tuple[Any, Any]:
    act, dact = _ACTIVATIONS[base]

    def forward(input: torch.Tensor, quantizer: Any) -> torch.Tensor:
        _no_quantizer(quantizer)
        gate, value = input.float().chunk(2, dim=-1)
        return (act(gate) * value).to(input.dtype)

    def backward(grad: torch.Tensor, input: torch.Tensor, quantizer: Any) -> torch.Tensor:
        _no_quantizer(quantizer)
        gate, value = input.float().chunk(2, dim=-1)
        dy = grad.float()
        return torch.cat([dy * value * dact(gate), dy * act(gate)], dim=-1).to(input.dtype)

    forward.__name__, backward.__name__ = name, f"d{name}"
    return forward, backward


def clamped_swiglu(input: torch.Tensor, quantizer: Any, limit: float = 7.0, alpha: float = 1.702,
                   glu_linear_offset: float = 1.0) -> torch.Tensor:
    """GPT-OSS's SwiGLU: the gate (first half) clamped above at `limit` through
    x * sigmoid(alpha * x), times the linear half clamped to [-limit, limit] plus the offset
    (1.0, the only one before 2.18 added the argument)."""
    _no_quantizer(quantizer)
    gate, linear = input.float().chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (linear.clamp(-limit, limit) + glu_linear_offset)).to(input.dtype)


def clamped_dswiglu(grad: torch.Tensor, input: torch.Tensor, quantizer: Any, limit: float = 7.0,
                    alpha: float = 1.702, glu_linear_offset: float = 1.0) -> torch.Tensor:
    """`clamped_swiglu`'s backward: no gradient flows through a clamped element."""
    _no_quantizer(quantizer)
    gate, linear = input.float().chunk(2, dim=-1)
    dy = grad.float()
    clamped_gate = gate.clamp(max=limit)
    sig = torch.sigmoid(alpha * clamped_gate)
    act = clamped_gate * sig
    dact = (sig * (1 + alpha * clamped_gate * (1 - sig))) * (gate <= limit)
    dlinear = dy * act * ((linear >= -limit) & (linear <= limit))
    dgate = dy * (linear.clamp(-limit, limit) + glu_linear_offset) * dact
    return torch.cat([dgate, dlinear], dim=-1).to(input.dtype)


def _dropout_scale(dropout_probability: float) -> float:
    if not 0 <= dropout_probability < 1:
        raise ValueError(f"Invalid dropout probability ({dropout_probability}).")
    return 1 / (1 - dropout_probability)


def dropout_fwd(input: torch.Tensor, dropout_probability: float, out: torch.Tensor | None = None
                ) -> list[torch.Tensor]:
    """TE's fused dropout (FP16/BF16, a multiple of 16 elements): each element draws 8 random
    bits and is dropped when they are below floor(p * 256); kept ones are scaled by 1 / (1 - p)
    in float32. Returns [output, mask], the mask one bit per element (1 keeps), packed 8 to a
    byte, lowest bit first. The bits come from the CUDA generator the device answers give
    (`torch.cuda.manual_seed` seeds it)."""
    from harness.targets.cpu_backend.device import cuda_generator

    if not isinstance(input, torch.Tensor) or input.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError("dropout of an FP8 or FP32 input is not available on the CPU backend")
    if input.numel() % 16:
        raise ValueError(f"Input tensor number of elements must be divisible by 16, but shape is {tuple(input.shape)}.")
    scale = _dropout_scale(dropout_probability)
    bits = torch.randint(0, 256, (input.numel(),), generator=cuda_generator(), dtype=torch.int32)
    keep = bits >= int(dropout_probability * 256)
    y = (input.float().reshape(-1) * keep * scale).reshape(input.shape).to(input.dtype)
    weights = 2 ** torch.arange(8, dtype=torch.int32)
    mask = (keep.reshape(-1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)
    return [_store(y, out), mask]


def dropout_bwd(grad_output: torch.Tensor, mask: torch.Tensor, dropout_probability: float,
                grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient through `dropout_fwd`'s packed mask."""
    keep = (mask.to(torch.int32).unsqueeze(-1) >> torch.arange(8, dtype=torch.int32)) & 1
    dx = grad_output.float().reshape(-1) * keep.reshape(-1) * _dropout_scale(dropout_probability)
    return _store(dx.reshape(grad_output.shape).to(grad_output.dtype), grad_input)


def get_num_cublas_streams() -> int:
    """The streams TE's grouped GEMM spreads over (each gets a workspace); one on the CPU."""
    return 1


def te_general_grouped_gemm(A: list[torch.Tensor], transa: bool, B: list[torch.Tensor], transb: bool,
                            D: list[torch.Tensor] | None, D_type: Any, m_splits: list[int], bias: list[torch.Tensor],
                            bias_type: Any, single_output: bool, pre_gelu_out: list[torch.Tensor], grad: bool,
                            workspace: list[torch.Tensor], workspace_size: int, accumulate: bool,
                            use_split_accumulator: bool, math_sm_count: int) -> list[torch.Tensor]:
    """One `generic_gemm` per group: D[i] = op(B[i]) @ op(A[i]). With `single_output`, D[0]
    holds the groups' outputs one after another by rows. A bias tensor with elements is the
    forward's bias, or with `grad` the buffer its gradient is written into; an empty one is
    none. Returns `bias`, as the extension does; D's tensors hold the outputs."""
    if any(t.numel() for t in pre_gelu_out):
        raise NotImplementedError("grouped GEMM with a GELU epilogue is not available on the CPU backend")
    if single_output and D is None:
        raise RuntimeError("not implemented, D should be allocated for single output case.")
    dtype = _out_dtype(D_type)
    row = 0
    for i, (a, b) in enumerate(zip(A, B)):
        rows = b.shape[-1] if transb else _matrix(b).shape[0]
        cols = a.shape[0] if transa else a.shape[-1]
        if single_output:
            out = D[0].reshape(-1, cols)[row:row + rows]  # type: ignore[index]
            row += rows
        else:
            out = D[i] if D is not None else torch.empty(rows, cols, dtype=dtype)
        has_bias = bias[i].numel() != 0
        if a.numel() == 0 or b.numel() == 0:
            if not accumulate:
                out.zero_()
            if has_bias and grad:
                bias[i].zero_()
            continue
        _, bias_grad, _, _ = generic_gemm(a, transa, b, transb, out, None, D_type,
                                          bias[i] if has_bias else None, bias_type, False, None, grad,
                                          workspace[0], workspace_size, accumulate, use_split_accumulator)
        if has_bias and grad:
            bias[i].copy_(bias_grad)
    return bias


ACTIVATION_KERNELS = {
    f.__name__: f
    for pair in [*(_activation(n) for n in ("gelu", "relu", "silu", "qgelu", "srelu")),
                 *(_gated(n, base) for n, base in _GATED.items())]
    for f in pair
}


def outside_autograd(kernel: Any) -> Any:
    """A kernel as the extension runs it: on raw memory, never recorded by autograd (it may
    write into a view that autograd would refuse to see modified, e.g. a gradient buffer's)."""
    @functools.wraps(kernel)
    def compiled(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return kernel(*args, **kwargs)

    return compiled


# What the `transformer_engine_torch` stand-in exposes from this module.
KERNELS = {f.__name__: outside_autograd(f) for f in (
    rmsnorm_fwd, rmsnorm_bwd, rmsnorm_bwd_add, layernorm_fwd, layernorm_bwd, generic_gemm, clamped_swiglu,
    clamped_dswiglu, dropout_fwd, dropout_bwd, get_num_cublas_streams, te_general_grouped_gemm,
    *ACTIVATION_KERNELS.values(), *GLU_KERNELS)}
ENUMS = {c.__name__: c for c in (DType, FP8FwdTensors, FP8BwdTensors, FP8TensorMeta)}
