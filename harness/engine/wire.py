"""Tensors as plain data, so a worker's raw observation crosses xdist's channel (and the run's
observations file, harness.runner.observations) and is read back where the judging happens, outside the target's process.

A tensor travels as its dtype's name, its shape and its bytes; everything else as the plain
values execnet carries (dicts, lists, tuples, strings, numbers, bytes). Reading back is strict:
the dtype from a fixed list, the byte count from the shape, nothing executed. A target can
send wrong values, never code that runs in the judge.
"""

from __future__ import annotations

import math
from typing import Any

import torch

TENSOR = "__tensor__"
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64)}
ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
MAX_DEPTH = 32
PLAIN = frozenset({str, int, float, bool, type(None), bytes})  # leaves: returned as they are, without a call


class WireError(ValueError):
    """An observation that cannot be read back as one (wrong shape, dtype or size)."""


def pack(value: Any) -> Any:
    """`value` with every tensor replaced by its plain form (a copy on the CPU, detached)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise WireError(f"a tensor of dtype {name} cannot be sent")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {TENSOR: [name, list(t.shape), data]}
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(pack(v) for v in value)
    return value


def unpack(value: Any, depth: int = 0) -> Any:
    """The value `pack` made, tensors rebuilt; WireError for anything that is not such a value."""
    if depth > MAX_DEPTH:
        raise WireError("an observation nested too deep")
    if isinstance(value, dict):
        if TENSOR in value:
            return _tensor(value[TENSOR])
        return {k: v if type(v) in PLAIN else unpack(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in PLAIN else unpack(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(v if type(v) in PLAIN else unpack(v, depth + 1) for v in value)
    return value


def _tensor(fields: Any) -> torch.Tensor:
    if not (isinstance(fields, (list, tuple)) and len(fields) == 3):
        raise WireError("a tensor field is not [dtype, shape, bytes]")
    name, shape, data = fields
    if name not in DTYPES:
        raise WireError(f"a tensor of unknown dtype {name!r}")
    if not (isinstance(shape, (list, tuple)) and all(isinstance(s, int) and 0 <= s for s in shape)):
        raise WireError(f"a tensor shape that is not a list of sizes: {shape!r}")
    dtype = DTYPES[name]
    size = math.prod(shape) * ITEMSIZE[name]
    if not isinstance(data, bytes) or len(data) != size:
        raise WireError(f"a {name} tensor of shape {list(shape)} with {len(data) if isinstance(data, bytes) else '?'}"
                        f" bytes, not {size}")
    if not size:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
