"""CPU compute ops, built as subclasses of the *loaded target's* `BasicOperation`.

TE's own RMSNorm, LayerNorm, BasicLinear, Bias and activations call kernels from the
compiled extension. These replacements compute the same maths in plain torch and
plug into the real fuser through the target's own `op_forward`/`op_backward`
contract, so the fuser treats them exactly as it treats TE's ops.

The backward re-runs the forward maths under autograd on detached copies of the
saved input: simple, and exact for these ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

BACKEND_OP_NAMES = ("RMSNorm", "LayerNorm", "BasicLinear", "Bias", "GELU", "ReLU", "SwiGLU")


def make_cpu_ops(basic_operation: type) -> dict[str, type]:
    """Return the CPU ops as subclasses of `basic_operation` (the target's class)."""

    class _CpuOp(basic_operation):  # type: ignore[misc, valid-type]
        """Shared forward/backward: subclasses give `compute(x, *params)`."""

        compute: Any  # (x, *params) -> output, given by each subclass

        def op_params(self) -> list[torch.nn.Parameter]:
            return list(self.parameters())

        def op_forward(self, ctx: Any, input_: torch.Tensor, **_kwargs: Any) -> torch.Tensor:
            if ctx.requires_grad:
                ctx.save_for_backward(input_)
            with torch.no_grad():
                return self.compute(input_, *self.op_params())

        def op_backward(self, ctx: Any, grad_output: torch.Tensor) -> tuple[Any, list[Any]]:
            (saved_input,) = ctx.saved_tensors
            params = self.op_params()
            with torch.enable_grad():
                x = saved_input.detach().requires_grad_(True)
                ps = [p.detach().requires_grad_(True) for p in params]
                y = self.compute(x, *ps)
                grads = torch.autograd.grad(y, [x, *ps], grad_output)
            grad_params = [g if p.requires_grad else None for g, p in zip(grads[1:], params)]
            return grads[0], grad_params

    def _param(shape: tuple[int, ...], device: Any, dtype: Any, init: float | None) -> torch.nn.Parameter:
        value = torch.empty(shape, device=device, dtype=dtype)
        if init is None:
            torch.nn.init.normal_(value, std=0.5)
        else:
            value.fill_(init)
        return torch.nn.Parameter(value)

    class RMSNorm(_CpuOp):
        def __init__(self, normalized_shape: int, *, eps: float = 1e-5, device: Any = "cpu",
                     dtype: torch.dtype = torch.float32, zero_centered_gamma: bool = False) -> None:
            super().__init__()
            self.eps, self.zero_centered_gamma = eps, zero_centered_gamma
            self.weight = _param((normalized_shape,), device, dtype, 0.0 if zero_centered_gamma else 1.0)

        def compute(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            w = weight + 1 if self.zero_centered_gamma else weight
            x32 = x.float()
            y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * w.float()
            return y.to(x.dtype)

    class LayerNorm(_CpuOp):
        def __init__(self, normalized_shape: int, *, eps: float = 1e-5, device: Any = "cpu",
                     dtype: torch.dtype = torch.float32) -> None:
            super().__init__()
            self.eps = eps
            self.weight = _param((normalized_shape,), device, dtype, 1.0)
            self.bias = _param((normalized_shape,), device, dtype, 0.0)

        def compute(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), self.eps)
            return y.to(x.dtype)

    class BasicLinear(_CpuOp):
        def __init__(self, in_features: int, out_features: int, *, device: Any = "cpu",
                     dtype: torch.dtype = torch.float32) -> None:
            super().__init__()
            self.weight = _param((out_features, in_features), device, dtype, None)

        def compute(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return x @ weight.t()

    class Bias(_CpuOp):
        def __init__(self, size: int, *, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> None:
            super().__init__()
            self.bias = _param((size,), device, dtype, None)

        def compute(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return x + bias

    class GELU(_CpuOp):
        def compute(self, x: torch.Tensor) -> torch.Tensor:
            return F.gelu(x, approximate="tanh")

    class ReLU(_CpuOp):
        def compute(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(x)

    class SwiGLU(_CpuOp):
        def compute(self, x: torch.Tensor) -> torch.Tensor:
            gate, value = x.chunk(2, dim=-1)
            return F.silu(gate) * value

    ops: dict[str, type] = {cls.__name__: cls for cls in (RMSNorm, LayerNorm, BasicLinear, Bias, GELU, ReLU, SwiGLU)}
    for cls in ops.values():
        cls.__qualname__ = f"cpu_backend.{cls.__name__}"
    assert tuple(ops) == BACKEND_OP_NAMES
    return ops
