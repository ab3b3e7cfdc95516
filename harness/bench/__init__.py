"""`repro bench`: time each pipeline × dtype × mode on several targets side by side.

Each target lives in its own long-lived worker process (`harness.bench.worker`; one TE
target per process). First every worker checks every combination once; only those that
complete on every target are timed, the rest are recorded with the reason. Then the
parent times each combination in rounds, alternating targets (A B C, B C A, ...), one
measurement at a time so workers never compete for the two cores; a worker builds, warms up
and calibrates a combination's steps once for all its rounds. Each worker also times the
unfused PyTorch reference of the same pipeline, a control for machine drift.
"""

from __future__ import annotations

import json
import os
import platform
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from cases.case import Case
from cases.matrix import common_exclusion, generate, parse_filters
from cases.pipelines import PIPELINES, ops_used
from harness import targets
from harness.bench import stats as bench_stats
from harness.errors import UsageError
from harness.runner import liveness, scratch
from harness.runner.rundir import check_writable, session_name
from harness.torch_version import torch_version

SCHEMA = "repro.perf/1"
DEFAULT_TARGETS = ("te-2.13.0", "te-2.13.0+backport", "te-2.16.0")
DEFAULT_UPSTREAM = "te-2.16.0"
START_TIMEOUT_S = 300
CHECK_TIMEOUT_S = 600
POLL_S = 1.0  # how often a waiting controller looks at a silent worker
# The worker's timing (harness.bench.worker): a block of calls long enough that the clock's and the
# loop's own cost vanish in it, after warm-up calls; at least MIN_BLOCKS blocks per measurement.
BLOCK_S = 0.001
WARMUP_CALLS = 3
MIN_BLOCKS = 3


class BenchWorkerError(RuntimeError):
    """A worker died, hung or answered nonsense; the message names it and its log."""


@dataclass(frozen=True)
class Mode:
    grad_mode: str
    input: str
    recompute: str
    backward: bool
    description: str


# Inputs: a plain leaf under no_grad and a leaf that requires grad elsewhere. Neither is
# the non-leaf that issue 22 needs, so the unpatched te-2.13.0 completes the plain modes
# too and the three targets time the same work.
MODES: dict[str, Mode] = {
    "fwd_no_grad": Mode("no_grad", "leaf", "none", False, "forward under torch.no_grad(), plain leaf input"),
    "fwd_grad": Mode("enabled", "leaf_requires_grad", "none", False, "forward with grad, leaf input requiring grad"),
    "fwd_bwd": Mode("enabled", "leaf_requires_grad", "none", True, "forward + backward"),
    "fwd_bwd_checkpoint_reentrant": Mode("enabled", "leaf_requires_grad", "checkpoint_reentrant", True,
                                         "forward + backward in torch.utils.checkpoint(use_reentrant=True)"),
    "fwd_bwd_checkpoint_non_reentrant": Mode("enabled", "leaf_requires_grad", "checkpoint_non_reentrant", True,
                                             "forward + backward in torch.utils.checkpoint(use_reentrant=False)"),
    "fwd_bwd_megatron": Mode("enabled", "leaf_requires_grad", "megatron", True,
                             "forward + backward in Megatron's CheckpointFunction"),
}


@dataclass(frozen=True)
class Shape:
    tokens: int
    hidden: int
    dtypes: tuple[str, ...] | None  # None: every dtype of the matrix
    description: str


# tiny: where the fuser's fixed cost per call shows; realistic: a transformer layer's
# activations (2048 tokens x hidden 4096, bfloat16), where the op's own work dominates.
SHAPES: dict[str, Shape] = {
    "tiny": Shape(4, 16, None, "4 tokens x hidden 16, the matrix's dtypes"),
    "realistic": Shape(2048, 4096, ("bfloat16",), "2048 tokens x hidden 4096, bfloat16"),
}
MATMUL_OPS = ("BasicLinear",)
CPU_MODES_AT_SCALE = ("fwd_no_grad", "fwd_bwd")
INPUT_NOTE = ("inputs: a plain leaf for fwd_no_grad, a leaf that requires grad for the grad modes (not issue 22's "
              "non-leaf), so te-2.13.0 completes them too; parameters trainable; shapes: "
              + "; ".join(f"{name} {shape.description}" for name, shape in SHAPES.items()))
CPU_MEMORY_NOTE = ("memory: not measured on the CPU: torch has no peak-allocation counter for CPU tensors, and the "
                   "profiler's memory view would slow the very calls being timed")
RATIO_NOTE = "ratios: per round, then median and min–max across rounds; a spread covering 1.0 is within noise"
TEST_SLOW_ENV = "REPRO_TEST_SLOW_TARGET"  # test-only: the worker of this spec sleeps in each fuser call
TEST_SLOW_SECONDS_ENV = "REPRO_TEST_SLOW_SECONDS"


def default_targets(matrix: str) -> tuple[str, ...]:
    """issue 22 (and its presets, all): the three targets of its ratios; another regression:
    its own default targets."""
    from cases.regressions import REGRESSIONS

    return DEFAULT_TARGETS if matrix not in REGRESSIONS or matrix == "issue22" else REGRESSIONS[matrix].default_targets


def default_upstream(matrix: str, specs: list[str] | None) -> str | None:
    """The upstream-fixed target of the ratios: issue 22's, else the first plain release among
    `specs` other than the patched target's base."""
    if default_targets(matrix) == DEFAULT_TARGETS:
        return DEFAULT_UPSTREAM
    bases = {s.split("+", 1)[0] for s in specs or [] if "+" in s}
    return next((s for s in specs or [] if "+" not in s and s not in bases), None)


def case_for(combo: dict[str, str]) -> Case:
    """The matrix case a combination corresponds to, so common_exclusion stays the one rule."""
    mode = MODES[combo["mode"]]
    return Case("issue22", "ops", combo["pipeline"], mode.grad_mode, mode.input, "trainable", mode.recompute,
                "single", "dense", combo["dtype"], combo["device"])


def combinations(matrix: str, only: list[str] | None, modes: list[str],
                 shapes: tuple[str, ...] = tuple(SHAPES)) -> list[dict[str, str]]:
    """pipeline × dtype × device from the matrix (in its order), × the bench modes, × the
    shapes; a shape with its own dtypes (realistic: bfloat16) uses those, whatever the matrix's,
    unless `--only dtype=` leaves them out."""
    wanted_dtypes = parse_filters(only).get("dtype")
    seen: dict[tuple[str, str, str], None] = {}
    selections = generate(matrix, only)
    for case in (c for selection in selections for c in selection.cases if c.get("pipeline")):
        # A regression's own scenario may not vary dtype or device: its pipelines on the CPU in float32.
        seen.setdefault((case.pipeline, case.get("dtype") or "float32", case.get("device") or "cpu"), None)
    if not seen:
        raise UsageError(f"repro bench times te.ops pipelines; matrix {matrix} varies none "
                         f"(scenario: {', '.join(sorted({s.regression.scenario.name for s in selections}))})")
    combos: dict[tuple[str, ...], None] = {}
    for shape in shapes:
        for pipeline, dtype, device in seen:
            for shape_dtype in [d for d in SHAPES[shape].dtypes or (dtype,) if not wanted_dtypes or d in wanted_dtypes]:
                for mode in modes:
                    combos.setdefault((pipeline, shape_dtype, device, mode, shape), None)
    keys = ("pipeline", "dtype", "device", "mode", "shape")
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def parse_shapes(text: str | None) -> tuple[str, ...]:
    chosen = tuple(s for s in (text.split(",") if text else SHAPES) if s)
    unknown = [s for s in chosen if s not in SHAPES]
    if unknown or not chosen:
        raise UsageError(f"unknown shape {','.join(unknown) or '(none)'}; valid: {', '.join(SHAPES)}")
    return chosen


def parse_modes(text: str | None) -> list[str]:
    chosen = [m for m in (text.split(",") if text else MODES) if m]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise UsageError(f"unknown mode {','.join(unknown) or '(none)'}; valid: {', '.join(MODES)}")
    return chosen


class Worker:
    """One target's bench worker: JSON lines in on stdin, JSON lines back on stdout."""

    def __init__(self, prepared: targets.PreparedTarget, log: Path, megatron_device: str | None,
                 on_slow: Callable[[str], None] = print, extra_env: dict[str, str] | None = None) -> None:
        self.spec, self.log, self.on_slow = prepared.spec, log, on_slow
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                             os.environ.get("PYTHONPATH", "")]), **(extra_env or {})}
        command = [sys.executable, "-m", "harness.bench.worker", prepared.to_json()]
        if megatron_device:
            command += ["--megatron", megatron_device]
        with open(log, "w") as handle:  # stderr to a file: a full pipe would stall the worker
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle,
                                            text=True, env=env)
        self.started = time.perf_counter()

    def send(self, command: dict[str, Any]) -> None:
        stdin: IO[str] = self.process.stdin  # type: ignore[assignment]
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next reply. A busy machine makes a worker slow, not dead: while its CPU time grows
        it is waited for (and said to be slow past `timeout`), up to liveness.CEILING times the bound; it
        fails when it exits, or makes no progress for `timeout` scaled by the machine's load."""
        stdout: IO[str] = self.process.stdout  # type: ignore[assignment]
        started = last_progress = time.monotonic()
        cpu, said_slow = liveness.cpu_seconds(self.process.pid), False
        while not select.select([stdout], [], [], POLL_S)[0] and self.process.poll() is None:
            now, seen = time.monotonic(), liveness.cpu_seconds(self.process.pid)
            if seen is not None and cpu is not None and seen - cpu >= liveness.PROGRESS_CPU_S:
                cpu, last_progress = seen, now
            bound = timeout * liveness.load_factor()
            if now - last_progress > bound:
                self._fail(f"made no progress for {now - last_progress:.0f} s (no CPU time used; {liveness.load_text()})")
            if now - started > liveness.CEILING * bound:
                self._fail(f"still working after {now - started:.0f} s, past {liveness.CEILING} times its bound")
            if not said_slow and now - started > timeout:
                said_slow = True
                self.on_slow(f"bench: {self.spec} is slow ({liveness.load_text()}); it is working, waiting for it")
        line = stdout.readline()
        if not line:  # end of output: the child is exiting, so its status comes soon
            try:
                status: int | str = self.process.wait(timeout=POLL_S * 20)
            except subprocess.TimeoutExpired:
                status = "its output (still running)"
            self._fail(f"exited {status}" if isinstance(status, int) else f"closed {status}")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise BenchWorkerError(f"bench worker for {self.spec} wrote a non-JSON line: {line[:200]!r}") from None

    def _fail(self, state: str) -> NoReturn:
        last = (self.log.read_text().strip().splitlines() or ["no output"])[-1]
        raise BenchWorkerError(f"bench worker for {self.spec} {state}: {last} (log: {self.log})")

    def ask(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(command)
        return self.receive(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def _static_reason(combo: dict[str, str], device_reasons: dict[str, str | None]) -> str | None:
    reason = common_exclusion(case_for(combo))
    if reason is None and device_reasons.get(combo["device"]):
        reason = f"device {combo['device']} unavailable: {device_reasons[combo['device']]}"
    if (reason is None and combo["shape"] != "tiny" and combo["device"] == "cpu"
            and set(MATMUL_OPS) & set(ops_used(PIPELINES[combo["pipeline"]]))):
        reason = f"{combo['shape']} shape: a pipeline with a matmul takes seconds per call on the CPU; timed on devices"
    if (reason is None and combo["shape"] != "tiny" and combo["device"] == "cpu"
            and combo["mode"] not in CPU_MODES_AT_SCALE):
        reason = (f"{combo['shape']} shape on the CPU: timed for {' and '.join(CPU_MODES_AT_SCALE)} only (the stand-in "
                  "kernels' own work, 60-400 ms a call, is the same in every target, and a recompute mode repeats "
                  "it); every mode on devices")
    return reason


def _check(workers: list[Worker], ready: dict[str, dict[str, Any]], combo: dict[str, str]) -> list[str]:
    """The targets' reasons the combination cannot be benched; none: each worker keeps its checked
    steps, warmed up and calibrated, for the timing that follows (harness.bench.worker)."""
    loaded = [w for w in workers if not ready[w.spec]["load_error"]]
    for worker in loaded:  # checked side by side: a check is not timed, and each target has its own process
        worker.send({"cmd": "check", "combos": [combo]})
    found = {w.spec: w.receive(CHECK_TIMEOUT_S)["reasons"][0] for w in loaded}
    reasons = []
    for worker in workers:
        if ready[worker.spec]["load_error"]:
            reasons.append(f"{worker.spec}: did not load: {ready[worker.spec]['load_error']}")
        elif found[worker.spec]:
            reasons.append(f"{worker.spec}: {found[worker.spec]}")
    return reasons


def _time_combo(workers: list[Worker], combo: dict[str, str], rounds: int, min_run_time: float,
                problems: list[str]) -> dict[str, Any]:
    """One combination's rounds, one after another. In each round every target times its fuser
    pipeline and, as a control for drift, the unfused PyTorch reference in its own process, in an
    order rotated from round to round so no target always runs right after the same neighbour."""
    timings: dict[str, dict[str, list[float | None]]] = {w.spec: {"fuser": [], "reference": []} for w in workers}
    iqrs: dict[str, dict[str, list[float | None]]] = {w.spec: {"fuser": [], "reference": []} for w in workers}
    memory: dict[str, dict[str, int | None]] = {}
    timeout = 120 + 20 * min_run_time
    for round_index in range(rounds):
        order = workers[round_index % len(workers):] + workers[:round_index % len(workers)]
        for worker, side in ((w, side) for w in order for side in ("fuser", "reference")):
            reply = worker.ask({"cmd": "time", "combo": combo, "reference": side == "reference",
                                "min_run_time": min_run_time}, timeout)
            if reply.get("error"):
                problems.append(f"round {round_index + 1} {bench_stats.row_name(combo)} {worker.spec} "
                                f"{side}: {reply['error']}")
            timings[worker.spec][side].append(reply.get("median_s"))
            iqrs[worker.spec][side].append(reply.get("iqr_s"))
            if reply.get("memory_bytes") is not None:
                memory.setdefault(worker.spec, {})[side] = reply["memory_bytes"]
    return {"timings_s": {spec: {side: {"median_per_round": timings[spec][side], "iqr_per_round": iqrs[spec][side]}
                                 for side in timings[spec]} for spec in timings},
            "memory_bytes": memory or None}


def run_bench(matrix: str, only: list[str] | None, specs: list[str], modes: list[str], rounds: int,
              min_run_time: float, out_dir: Path, cache: Path, offline: bool = False,
              upstream: str | None = DEFAULT_UPSTREAM, progress: Callable[[str], None] = print,
              shapes: tuple[str, ...] = tuple(SHAPES)) -> dict[str, Any]:
    """Check, then time; returns the `perf` block (schema repro.perf/1)."""
    if rounds < 2:
        raise UsageError("--rounds must be at least 2: the spread across rounds is what tells noise from change")
    if min_run_time <= 0:
        raise UsageError("--min-run-time must be positive")
    todo = combinations(matrix, only, modes, shapes)
    check_writable(out_dir)
    prepared = [targets.prepare(spec, cache, offline) for spec in specs]
    from harness.targets.devices import unavailable_reasons

    device_reasons: dict[str, str | None] = {"cpu": None}
    if any(c["device"] != "cpu" for c in todo):
        device_reasons = unavailable_reasons()
    excluded: list[dict[str, Any]] = []
    candidates = []
    for combo in todo:
        reason = _static_reason(combo, device_reasons)
        if reason:
            excluded.append({**combo, "reason": reason})
        else:
            candidates.append(combo)
    wants_megatron = any(MODES[c["mode"]].recompute == "megatron" for c in candidates)
    megatron_device = ("cuda" if any(c["device"] == "cuda" for c in candidates) else "cpu") if wants_megatron else None
    logs = out_dir / "bench-logs"
    logs.mkdir(exist_ok=True)
    with scratch.scratch(out_dir) as env:  # the workers' temporary files, removed once they have ended
        workers = [Worker(p, logs / f"{session_name(p.spec)}.log", megatron_device, progress, env) for p in prepared]
        phases = {"checking": 0.0, "timing": 0.0}
        try:
            ready = {w.spec: w.receive(START_TIMEOUT_S) for w in workers}
            startup = {w.spec: ready[w.spec]["startup_s"] for w in workers}
            progress(f"bench: {len(candidates)} combinations to check and time on {len(workers)} targets, {rounds} rounds "
                     f"each, min_run_time {min_run_time}s (start-up {', '.join(f'{s} {t:.1f}s' for s, t in startup.items())})")
            benched: list[dict[str, str]] = []
            timed: list[dict[str, Any]] = []
            problems: list[str] = []
            for index, combo in enumerate(candidates):
                began = time.perf_counter()
                reasons = _check(workers, ready, combo)
                phases["checking"] += time.perf_counter() - began
                if reasons:
                    excluded.append({**combo, "reason": "; ".join(reasons)})
                else:
                    benched.append(combo)
                    began = time.perf_counter()
                    timed.append(_time_combo(workers, combo, rounds, min_run_time, problems))
                    phases["timing"] += time.perf_counter() - began
                if (index + 1) % max(1, len(candidates) // 10) == 0 or index + 1 == len(candidates):
                    progress(f"  {index + 1}/{len(candidates)} combinations: {len(benched)} timed, "
                             f"{len(excluded)} excluded with a reason ({phases['checking']:.0f} s checking, "
                             f"{phases['timing']:.0f} s timing)")
        finally:
            for worker in workers:
                worker.close()
    rows = []
    for combo, extra in zip(benched, timed, strict=True):
        medians = {spec: {side: v["median_per_round"] for side, v in sides.items()}
                   for spec, sides in extra["timings_s"].items()}
        mode = MODES[combo["mode"]]
        rows.append({**combo, "grad_mode": mode.grad_mode, "input": mode.input, "recompute": mode.recompute,
                     "backward": mode.backward, "ratios": bench_stats.row_ratios(medians, specs, upstream), **extra})
    slowed = {w["spec"]: w["test_slowdown_s"] for w in ready.values() if w.get("test_slowdown_s")}
    pairs = bench_stats.pairings(specs, upstream)
    return {
        "schema": SCHEMA, "matrix": matrix, "only": only or [], "rounds": rounds, "min_run_time": min_run_time,
        "targets": [{"spec": p.spec, "version": p.version, "fuser_sha": p.fuser_sha, "patch_status": p.patch_status,
                     "startup_s": startup.get(p.spec), "description": ready[p.spec].get("description", "")}
                    for p in prepared],
        "phases_s": {name: round(seconds, 1) for name, seconds in phases.items()},
        "comparisons": {label: list(pair) if pair else None for label, pair in pairs.items()},
        "modes": {m: asdict(MODES[m]) for m in modes},
        "shapes": {name: asdict(SHAPES[name]) for name in shapes},
        "environment": {"torch": torch_version(), "python": platform.python_version(),
                        "machine": platform.node(), "cpus": os.cpu_count()},
        "timer": (f"blocks of calls calibrated to {BLOCK_S * 1e3:g} ms after the check's two warm-up calls, at "
                  f"least {MIN_BLOCKS} blocks (one when a block outlasts it) and min_run_time per measurement, "
                  "torch on 1 thread; per call: median and IQR of blocks"),
        "notes": [INPUT_NOTE, RATIO_NOTE] + ([CPU_MEMORY_NOTE] if any(c["device"] == "cpu" for c in todo) else []),
        "test_slowdown": slowed or None,
        "problems": problems,
        "rows": rows, "excluded": excluded,
    }

