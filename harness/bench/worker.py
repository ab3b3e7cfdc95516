"""A bench worker: load one target, then answer JSON-line commands on stdin.

    python -m harness.bench.worker '<PreparedTarget JSON>' [--megatron DEVICE]

Commands: {"cmd": "check", "combos": [...]} -> {"reasons": [str | null, ...]};
{"cmd": "time", "combo": {...}, "reference": bool, "min_run_time": s} -> {"median_s",
"iqr_s", "blocks", "number_per_run", "memory_bytes", "error"}; {"cmd": "quit"}. A combination's
steps are built, warmed up and calibrated (calls per block) at its first "time" and reused for
its later rounds.
The first line out is {"ready": true, "load_error", "megatron_error", "startup_s", ...}.

Only the replies go to the real stdout: anything a library prints is sent to stderr,
so it can never be mistaken for (or corrupt) a reply.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import IO, Any, cast

STARTED = time.perf_counter()

import torch  # after STARTED, so start-up time includes importing torch

from cases import pipelines
from cases.pipelines import PIPELINES, ops_used
from harness.bench import (
    BLOCK_S,
    MIN_BLOCKS,
    MODES,
    SHAPES,
    TEST_SLOW_ENV,
    TEST_SLOW_SECONDS_ENV,
    WARMUP_CALLS,
    case_for,
)
from harness.engine.calls import grad_mode, wrap
from harness.engine.execute import DTYPES, build_module, import_megatron, megatron_checkpoint
from harness.engine.frames import error_record
from harness.targets import PreparedTarget
from harness.targets.devices import synchronize
from harness.targets.loader import LoadedTarget


def make_step(target: LoadedTarget, combo: dict[str, str], reference: bool,
              slow_s: float = 0.0) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """One call of the combination, ready to repeat: the target's fuser pipeline, or the
    unfused reference with the same parameter values. Returns it with the caller's tensors."""
    mode, case, info = MODES[combo["mode"]], case_for(combo), PIPELINES[combo["pipeline"]]
    shape = SHAPES[combo.get("shape", "tiny")]
    # The catalogue's builders and references read the hidden size from this module global
    # when called; this process only benches, one combination at a time.
    pipelines.HIDDEN = shape.hidden
    torch.manual_seed(0)
    module = build_module(case, target)
    wants_grad = mode.input == "leaf_requires_grad"
    inputs = [torch.randn(shape.tokens, shape.hidden, dtype=DTYPES[case.dtype], device=case.device)
              .requires_grad_(wants_grad)
              for _ in range(1 + info.num_extra_inputs)]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]

    def unfused(x: torch.Tensor, *extra: torch.Tensor) -> Any:
        return info.reference(x, extra, params)

    def slowed(*args: torch.Tensor) -> Any:  # test-only: a deliberately slowed target
        time.sleep(slow_s)
        return module(*args)

    function: Callable[..., Any] = unfused if reference else slowed if slow_s else module
    call = wrap(function, mode.recompute, megatron_checkpoint(case))

    def step() -> None:
        with grad_mode(mode.grad_mode):
            outputs = call(*inputs)
            if mode.backward:
                needing = [o for o in (outputs if isinstance(outputs, tuple) else (outputs,)) if o.requires_grad]
                if not needing:
                    raise RuntimeError("no output requires grad: nothing to run backward through")
                sum(o.float().sum() for o in needing).backward()  # type: ignore[union-attr]

    return step, inputs


def check(target: LoadedTarget, combo: dict[str, str], megatron_error: str | None, slow_s: float) -> str | None:
    """Why this combination cannot be timed on this target, or None. Twice, since a
    second call is what the timing loop repeats."""
    if MODES[combo["mode"]].recompute == "megatron" and megatron_error:
        return megatron_error
    missing = [op for op in target.missing_ops if op in ops_used(PIPELINES[combo["pipeline"]])]
    if missing:
        return f"lacks {', '.join(missing)}: {target.missing_ops[missing[0]]}"
    for reference in (False, True):
        side = "reference" if reference else "fuser"
        try:
            step, inputs = make_step(target, combo, reference, slow_s)
        except Exception as exc:  # noqa: BLE001
            return f"{side} could not be built: {type(exc).__name__}: {exc}"
        flags = [t.requires_grad for t in inputs]
        for call in ("first", "second"):
            try:
                began = time.perf_counter()
                step()
                seconds = time.perf_counter() - began
            except Exception as exc:  # noqa: BLE001 — the reason it is excluded
                error = error_record(exc, None if reference else target.te_dir)
                where = f" at {error['location']}" if error["location"] else ""
                return f"{side} {call} call raised {error['type']}: {(error['message'].splitlines() or [''])[0]}{where}"
            # Checked after each call: the flag a first call clears makes the second fail
            # for a reason that no longer names the cause.
            if [t.requires_grad for t in inputs] != flags:
                return (f"{side} {call} call changed the caller's input requires_grad (issue 22's side effect), "
                        "so repeated calls would time different work")
        _keep(combo, reference, step, seconds)  # its two calls were the warm-up: kept, calibrated, for the timing
    return None


def peak_memory(step: Callable[[], None], device: str) -> int | None:
    """Peak bytes allocated above the baseline during one call, on CUDA or NPU."""
    if device not in ("cuda", "npu"):
        return None
    backend: Any = getattr(torch, device)
    synchronize(device)
    backend.reset_peak_memory_stats()
    baseline = backend.memory_allocated()
    step()
    synchronize(device)
    return int(backend.max_memory_allocated() - baseline)


_prepared: dict[str | bool, Any] = {}  # the combination being timed: its steps, built, warmed up and calibrated once


def _block(step: Callable[[], None], number: int, device: str) -> float:
    """Seconds for `number` calls; the accelerator synchronised at the block's edges only (a sync
    per call would time the sync instead of the work)."""
    synchronize(device)
    began = time.perf_counter()
    for _ in range(number):
        step()
    synchronize(device)
    return time.perf_counter() - began


def _keep(combo: dict[str, str], reference: bool, step: Callable[[], None], last_call_s: float) -> None:
    """Keep a warmed-up step with the number of calls a block needs, for the combination in hand
    only (the parent checks and times one combination at a time), so the realistic shape's
    tensors are held for one combination at a time. A last call that outlasts a block needs no
    calibration (one call a block)."""
    key = json.dumps(combo, sort_keys=True)
    if _prepared.get("key") != key:
        _prepared.clear()
        _prepared["key"] = key
    number, seconds = 1, last_call_s
    while seconds < BLOCK_S and number < 1 << 16:
        number = max(number * 2, int(number * BLOCK_S / max(seconds, 1e-9)) + 1)
        seconds = _block(step, number, combo["device"])
    _prepared[reference] = (step, number)


def calibrated_step(target: LoadedTarget, combo: dict[str, str], reference: bool,
                    slow_s: float) -> tuple[Callable[[], None], int]:
    """The combination's step, built once, warmed up (by its check, or here), with the number of
    calls a block needs."""
    if _prepared.get("key") != json.dumps(combo, sort_keys=True) or reference not in _prepared:
        step, _ = make_step(target, combo, reference, slow_s)
        for _ in range(WARMUP_CALLS):
            step()
        _keep(combo, reference, step, _block(step, 1, combo["device"]))
    # The catalogue's references read the hidden size from this module global when called.
    pipelines.HIDDEN = SHAPES[combo.get("shape", "tiny")].hidden
    return cast(tuple[Callable[[], None], int], _prepared[reference])


def time_combo(target: LoadedTarget, command: dict[str, Any], slow_s: float) -> dict[str, Any]:
    """Blocks of the calibrated number of calls until `min_run_time` is spent, at least MIN_BLOCKS
    of them unless one block alone outlasts it (a call of a realistic shape on the CPU takes
    60-400 ms: one call a round, and the rounds are the samples): the median and IQR of the
    per-call time over the blocks."""
    combo = command["combo"]
    try:
        step, number = calibrated_step(target, combo, command["reference"], slow_s)
        per_call: list[float] = []
        spent, needed = 0.0, MIN_BLOCKS
        while len(per_call) < needed or spent < command["min_run_time"]:
            seconds = _block(step, number, combo["device"])
            if not per_call and seconds >= command["min_run_time"]:
                needed = 1
            spent += seconds
            per_call.append(seconds / number)
        memory = peak_memory(step, combo["device"])
    except Exception as exc:  # noqa: BLE001 — reported to the parent, which records it
        return {"median_s": None, "iqr_s": None, "error": f"{type(exc).__name__}: {exc}"}
    quartiles = statistics.quantiles(per_call, n=4) if len(per_call) > 1 else [per_call[0]] * 3
    return {"median_s": statistics.median(per_call), "iqr_s": quartiles[2] - quartiles[0], "blocks": len(per_call),
            "number_per_run": number, "memory_bytes": memory, "error": None}


def _private_stdout() -> IO[str]:
    """The real stdout for replies; fd 1 itself then points at stderr."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


def main() -> None:
    prepared = PreparedTarget.from_json(sys.argv[1])
    torch.set_num_threads(1)  # as the timing reports it: one measurement at a time, each on one thread
    replies = _private_stdout()
    megatron_device = sys.argv[sys.argv.index("--megatron") + 1] if "--megatron" in sys.argv else None
    slow_s = float(os.environ.get(TEST_SLOW_SECONDS_ENV, "0.005")) if os.environ.get(TEST_SLOW_ENV) == prepared.spec else 0.0
    ready: dict[str, Any] = {"ready": True, "spec": prepared.spec, "load_error": None, "megatron_error": None,
                             "test_slowdown_s": slow_s or None}
    megatron_error = None
    from harness.errors import TargetLoadError
    from harness.targets.loader import load

    target = None
    try:
        target = load(prepared)
        ready["description"] = target.description
    except TargetLoadError as exc:
        ready["load_error"] = str(exc)
    if megatron_device and target is not None:
        try:  # after the target: importing megatron probes `import transformer_engine`
            import_megatron(megatron_device)
        except Exception as exc:  # noqa: BLE001 — megatron modes are then excluded with this reason
            megatron_error = f"megatron-core CheckpointFunction unavailable: {exc}"
    ready["megatron_error"] = megatron_error
    ready["startup_s"] = round(time.perf_counter() - STARTED, 3)
    replies.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit" or target is None:
            break
        if command["cmd"] == "check":
            reply: dict[str, Any] = {"reasons": [check(target, c, megatron_error, slow_s) for c in command["combos"]]}
        else:
            reply = time_combo(target, command, slow_s)
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
