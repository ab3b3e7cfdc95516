"""How fast is the harness itself? Prints four figures:

1. wall time of `repro run --matrix issue22` (a subprocess, into a temporary run dir),
   and the cases per second it sustains;
2. the harness's per-case overhead: `run_case` (build, reference, checks, backward)
   against a bare call of the same pipeline, on a sample of cases, in this process;
3. worker start-up: a run of one trivial case (pytest session, xdist worker, torch,
   target load), through the CLI and through `run_matrix`, less the case itself;
4. a bench worker's start-up (`harness.bench.worker`, torch + target load).

    python benchmarks/harness_speed.py [--target te-2.16.0] [--sample 60] [--skip-full-run] [--json PATH]

The figures depend on the machine and on what else runs on it: the load average is
printed with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ONE_CASE = ["--matrix", "smoke", "--only", "pipeline=rmsnorm", "--only", "grad_mode=enabled", "--only", "input=leaf",
            "--only", "recompute=none"]


def full_run(targets: str | None) -> dict[str, Any]:
    """Figure 1: `repro run --matrix issue22` end to end, as a user runs it."""
    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp:
        command = [sys.executable, "-m", "repro", "run", "--matrix", "issue22", "--out", tmp]
        command += ["--targets", targets] if targets else []
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
        wall = time.perf_counter() - started
        run = json.loads((Path(tmp) / "run.json").read_text()) if (Path(tmp) / "run.json").is_file() else None
    if run is None:
        return {"error": f"repro run exited {result.returncode}: {result.stderr.strip()[-400:]}"}
    executed = [r for r in run["results"] if r["outcome"] != "skipped"]
    return {"wall_s": wall, "exit": result.returncode, "records": len(run["results"]), "executed": len(executed),
            "executed_per_s": len(executed) / wall, "records_per_s": len(run["results"]) / wall,
            "sum_case_duration_s": sum(r["duration_s"] for r in executed),
            "targets": [t["spec"] for t in run["environment"]["targets"]]}


def startup(target: str) -> dict[str, Any]:
    """Figure 3: one trivial case, through the CLI and through run_matrix."""
    from harness.runner.sessions import run_matrix
    from harness.targets import sources

    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "repro", "run", *ONE_CASE, "--targets", target, "--out", tmp],
                       capture_output=True, check=False, cwd=REPO)
        cli_wall = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp:
        only = [ONE_CASE[i + 1] for i in range(2, len(ONE_CASE), 2)]
        started = time.perf_counter()
        run = run_matrix("smoke", only, [target], Path(tmp), 1, sources.cache_dir(), progress=lambda _: None)
        session_wall = time.perf_counter() - started
    case_s = sum(r["duration_s"] for r in run["results"])
    return {"cli_one_case_s": cli_wall, "session_one_case_s": session_wall, "case_s": case_s,
            "session_startup_s": session_wall - case_s, "cases": len(run["results"])}


def bench_worker_startup(target: str) -> dict[str, Any]:
    """Figure 4: time until a bench worker (no Megatron) says it is ready."""
    from harness import targets
    from harness.bench import Worker
    from harness.targets import sources

    prepared = targets.prepare(target, sources.cache_dir())
    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp:
        started = time.perf_counter()
        worker = Worker(prepared, Path(tmp) / "worker.log", None)
        ready = worker.receive(300)
        wall = time.perf_counter() - started
        worker.close()
    return {"wall_s": wall, "reported_startup_s": ready["startup_s"]}


def per_case_overhead(target_spec: str, sample: int) -> dict[str, Any]:
    """Figure 2, in this process (which then holds that target): run_case against the
    bare pipeline call it wraps, per case, on an even sample of issue22's runnable cases."""
    import torch

    from cases.matrix import generate, skip_reason
    from cases.pipelines import HIDDEN
    from harness import targets
    from harness.engine.execute import DTYPES, build_module, grad_mode, import_megatron, make_inputs, run_case, wrap
    from harness.targets import sources
    from harness.targets.loader import load

    import_megatron("cpu")  # before the target: megatron probes `import transformer_engine`
    target = load(targets.prepare(target_spec, sources.cache_dir()))
    # Checkpoint warns on cases whose inputs need no grad; those cases are meant to run so.
    warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
    runnable = [c for c in generate("issue22") if skip_reason(c) is None]
    chosen = runnable[:: max(1, len(runnable) // sample)][:sample]
    harness_ms, bare_ms = [], []
    for case in chosen:
        run_case(case, target)  # warm-up: first-call costs belong to neither side
        times = []
        for _ in range(3):
            started = time.perf_counter()
            run_case(case, target)
            times.append(time.perf_counter() - started)
        harness_ms.append(1e3 * statistics.median(times))
        module = build_module(case, target)
        dtype = DTYPES[case.dtype]
        values, residual = torch.randn(4, HIDDEN, dtype=dtype), torch.randn(4, HIDDEN, dtype=dtype)
        call = wrap(module, case.recompute, case.device)
        times = []
        for _ in range(20):
            tensors = make_inputs(case, values, residual)  # fresh caller tensors, outside the clock
            args = [tensors["x"]] + ([tensors["residual"]] if "residual" in tensors else [])
            started = time.perf_counter()
            # An issue-22 crash still costs its call, so it is timed, not skipped.
            with contextlib.suppress(Exception), grad_mode(case.grad_mode):
                call(*args)
            times.append(time.perf_counter() - started)
        bare_ms.append(1e3 * statistics.median(times))
    overhead = [h - b for h, b in zip(harness_ms, bare_ms, strict=True)]
    return {"target": target_spec, "cases": len(chosen), "run_case_ms": statistics.mean(harness_ms),
            "bare_call_ms": statistics.mean(bare_ms), "overhead_ms": statistics.mean(overhead),
            "overhead_median_ms": statistics.median(overhead)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="te-2.16.0", help="target for the in-process and start-up figures")
    parser.add_argument("--targets", help="targets of the full issue22 run (default: repro run's defaults)")
    parser.add_argument("--sample", type=int, default=60, help="cases sampled for the per-case overhead")
    parser.add_argument("--skip-full-run", action="store_true", help="leave out figure 1 (minutes)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    figures: dict[str, Any] = {"load_average_before": os.getloadavg(), "cpus": os.cpu_count()}
    if not args.skip_full_run:
        figures["issue22_run"] = full_run(args.targets)
    figures["worker_startup"] = startup(args.target)
    figures["bench_worker_startup"] = bench_worker_startup(args.target)
    figures["per_case"] = per_case_overhead(args.target, args.sample)  # last: it loads a target here
    figures["load_average_after"] = os.getloadavg()
    run, start, case = figures.get("issue22_run"), figures["worker_startup"], figures["per_case"]
    print(f"machine: {figures['cpus']} CPUs, load average before {figures['load_average_before'][0]:.2f}, "
          f"after {figures['load_average_after'][0]:.2f}")
    if run and "error" not in run:
        print(f"repro run --matrix issue22: {run['wall_s']:.1f} s wall over {', '.join(run['targets'])}; "
              f"{run['executed']} cases executed ({run['records']} records with skips): "
              f"{run['executed_per_s']:.1f} cases/s ({run['records_per_s']:.1f} records/s); "
              f"sum of case durations {run['sum_case_duration_s']:.1f} s")
    elif run:
        print(f"repro run --matrix issue22: {run['error']}")
    print(f"per-case overhead ({case['cases']} cases of issue22 on {case['target']}): run_case "
          f"{case['run_case_ms']:.2f} ms vs bare pipeline call {case['bare_call_ms']:.2f} ms: "
          f"overhead {case['overhead_ms']:.2f} ms mean, {case['overhead_median_ms']:.2f} ms median")
    print(f"worker start-up (1 trivial case on {args.target}): repro run {start['cli_one_case_s']:.1f} s wall; "
          f"pytest session via run_matrix {start['session_one_case_s']:.1f} s, of which the case "
          f"{1e3 * start['case_s']:.1f} ms: start-up {start['session_startup_s']:.1f} s")
    print(f"bench worker start-up: {figures['bench_worker_startup']['wall_s']:.1f} s "
          f"(worker's own count {figures['bench_worker_startup']['reported_startup_s']:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
