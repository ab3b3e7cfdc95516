"""The bug report's scenario through Megatron's own code, once: what `repro minimal --client` runs.

The input is a non-leaf tensor that requires grad (as an embedding output is). The client
runs under its recompute: Megatron's block recompute for `megatron_block`, Megatron's
`tensor_parallel.checkpoint` around `megatron_norm`. If it raises, the result carries the
error, the frames from Megatron's layer down to fuser.py, and the frame table against the
report. If it completes, outputs and gradients (input and every parameter) are compared with
the reference side built from the same weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from harness.engine.checks import TOLERANCES
from harness.engine.frames import error_record
from harness.errors import UsageError
from harness.megatron import frames
from harness.megatron.clients import BLOCK_RECOMPUTES, ClientParts, build_client, fused_norm_structure
from harness.megatron.loader import LoadedMegatron
from harness.targets.loader import LoadedTarget

# client -> the recompute each accepts here, the first being the report's.
RECOMPUTES = {"megatron_norm": ("megatron_checkpoint", "none"), "megatron_block": ("full_block", *BLOCK_RECOMPUTES)}


def _wrapped(parts: ClientParts, megatron: LoadedMegatron, norm_recompute: str) -> Callable[..., Any]:
    if norm_recompute == "megatron_checkpoint":
        checkpoint = megatron.module("tensor_parallel.random").checkpoint
        return lambda x: checkpoint(parts.test, False, x)
    return parts.test


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype=dtype, device=device)
    leaf = values.clone().requires_grad_()
    return leaf, leaf * 1  # the caller's leaf, and the non-leaf the client gets


def _compare(actual: dict[str, torch.Tensor | None], expected: dict[str, torch.Tensor | None]) -> list[str]:
    failures = []
    for name, want in expected.items():
        got = actual.get(name)
        if (got is None) != (want is None):
            failures.append(f"{name}: {'missing' if got is None else 'unexpected'} (reference has "
                            f"{'none' if want is None else 'one'})")
            continue
        if got is None or want is None:
            continue
        try:
            torch.testing.assert_close(got, want, **TOLERANCES[want.dtype])
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0]}")
    return failures


def run_client_minimal(target: LoadedTarget, megatron: LoadedMegatron, client: str, recompute: str | None = None,
                       dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """One run of `client`; a JSON-serialisable result."""
    if client not in RECOMPUTES:
        raise UsageError(f"unknown client {client!r}; valid: {', '.join(RECOMPUTES)}")
    recompute = recompute or RECOMPUTES[client][0]
    if recompute not in RECOMPUTES[client]:
        raise UsageError(f"{client} takes recompute {', '.join(RECOMPUTES[client])}, not {recompute!r}")
    started = time.perf_counter()
    block_recompute = recompute if client == "megatron_block" else "none"
    parts = build_client(client, target, megatron, recompute=block_recompute, dtype=dtype, device=device, seed=seed)
    built = time.perf_counter()
    result: dict[str, Any] = {"client": client, "recompute": recompute, "description": parts.description,
                              "build_s": round(built - started, 4)}
    leaf, x = _inputs(parts.input_shape, dtype, device, seed)
    try:
        outputs = _wrapped(parts, megatron, recompute)(x)
        weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 2 + i)).to(o)
                   for i, o in enumerate(outputs)]
        torch.stack([(o.float() * w.float()).sum() for o, w in zip(outputs, weights)]).sum().backward()
    except Exception as exc:  # noqa: BLE001 — the observation this exists to record
        result.update(completed=False, error=error_record(exc, target.te_dir),
                      frames=[f.__dict__ for f in frames.layer_to_fuser(exc)],
                      frame_table=[row.as_dict() for row in frames.frame_table(exc)],
                      run_s=round(time.perf_counter() - built, 4))
        result["matches_report"] = frames.matches_report(frames.frame_table(exc)) and (
            result["error"]["type"], frames.REPORT_ERROR[1] in result["error"]["message"]) == (
            frames.REPORT_ERROR[0], True)
        return result
    ref_leaf, ref_x = _inputs(parts.input_shape, dtype, device, seed)
    ref_outputs = parts.reference(ref_x)
    torch.stack([(o.float() * w.float()).sum() for o, w in zip(ref_outputs, weights)]).sum().backward()
    failures = _compare({f"output {i}": o.detach() for i, o in enumerate(outputs)},
                        {f"output {i}": o.detach() for i, o in enumerate(ref_outputs)})
    failures += _compare({"grad of input": leaf.grad, **{f"grad of {n}": p.grad for n, p in parts.test_params.items()}},
                         {"grad of input": ref_leaf.grad,
                          **{f"grad of {n}": p.grad for n, p in parts.reference_params.items()}})
    result.update(completed=True, error=None, matched=not failures, failures=failures,
                  structure=fused_norm_structure(parts),
                  compared={"outputs": len(outputs), "parameter_grads": len(parts.test_params)},
                  run_s=round(time.perf_counter() - built, 4))
    return result
