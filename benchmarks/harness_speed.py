"""How close does `repro run` come to the compute it runs? From one run it prints:

1. the run: wall time of `repro run --matrix M` (a subprocess, into a temporary run dir,
   as a user runs it) and the cases per second it sustains;
2. the compute floor of the same cases, measured in the same round: each target loaded in
   a subprocess of its own (one target per process, as in the run), each case it ran observed
   and judged (harness.runner.records observe, then judged), timed; the plain-PyTorch
   references once per case definition in a process of their own (the run's judge computes
   them once for every target); the floor is that compute spread over the run's parallel workers, with and
   without each process's start-up. It is measured twice: its processes one at a time (each with the
   machine to itself) and as many at a time as the run has workers (as the run runs its targets: two
   processes on two cores slow each other down, and no harness avoids that);
3. wall / floor, the harness's cost as a ratio;
4. worker start-up, split into torch import, target load and Megatron import, as the
   run's own workers measured it (sessions/*.startup.jsonl), next to the floor processes'.

    python benchmarks/harness_speed.py [--matrix issue22] [--targets A,B] [-n 2] [--threads-too] [--json PATH]
                                       [--old CHECKOUT [--rounds R]]

Each round measures the floor anew, right after its first run: the machine's speed drifts within
minutes, so each run is set against its own round's floor. With `--old`, an older checkout's
`repro run` is timed too, on the floor's other side (new, floor, old; then old, floor, new), so both
sides see the same machine: each side's wall / (floor + start-up) per round, and the new side's wall
over the old's (medians over the rounds).

Figures depend on the machine and on what else runs on it: the load average is printed
with them. Ratios, never a pass or fail on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timed_run import timed_repro_run

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's harness, as the floor's processes get it (PYTHONPATH)

from harness.runner import scratch


def run_once(matrix: str, targets: str | None, workers: int, out: Path, only: list[str],
             checkout: Path = REPO) -> dict[str, Any]:
    """Figure 1: `repro run` end to end, from `checkout`."""
    args = ["--matrix", matrix, "-n", str(workers), *(["--targets", targets] if targets else []),
            *(a for o in only for a in ("--only", o))]
    wall, exit_status, run, cpu = timed_repro_run(checkout, out, args)
    startups: dict[str, dict[str, Any]] = {}
    for path in (out / "sessions").glob("*.startup.jsonl"):
        for line in path.read_text().splitlines():  # the last line of each worker holds all its figures
            entry = json.loads(line)
            startups[f"{path.name.removesuffix('.startup.jsonl')}/{entry['pid']}"] = entry
    return {"wall_s": wall, "cpu_s": cpu, "exit": exit_status, "cases": len(run["results"]),
            "cases_per_s": len(run["results"]) / wall, "sum_case_duration_s": sum(r["duration_s"] for r in run["results"]),
            "targets": [t["spec"] for t in run["environment"]["targets"]], "worker_startups": startups,
            "case_ids": {spec: [r["case_id"] for r in run["results"] if r["target"] == spec]
                         for spec in [t["spec"] for t in run["environment"]["targets"]]}}


def floor_worker(spec: str, case_file: str, threads: int) -> None:
    """In a fresh process (`--floor-worker`): load the target, time run_case for the given
    cases, print the figures as JSON on the last line of stdout."""
    started = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - started
    if threads:
        torch.set_num_threads(threads)
    import warnings

    from cases.case import Case
    from cases.clients import needs_megatron
    from harness import targets
    from harness.engine.execute import import_megatron, missing_features
    from harness.engine.reference import independent, reference_side
    from harness.model import Role
    from harness.runner.records import judged, observe
    from harness.targets import sources
    from harness.targets.loader import load

    loading = time.perf_counter()
    target = load(targets.prepare(spec, sources.cache_dir()))
    load_s = time.perf_counter() - loading
    cases = [Case.from_id(case_id) for case_id in json.loads(Path(case_file).read_text())]
    megatron_s = None
    if any(needs_megatron(c) for c in cases):
        importing = time.perf_counter()
        import_megatron("cpu")
        megatron_s = time.perf_counter() - importing
    # As in the run's workers (-p no:warnings): checkpoint warns on cases whose inputs need no grad.
    warnings.filterwarnings("ignore")
    # The run computes each reference once for every target (its judge): not this floor's.
    references = {c.case_id: reference_side(c) for c in cases if independent(c)}
    compute, judging, ran = 0.0, 0.0, 0
    for case in cases:
        if missing_features(case, target):
            continue  # recorded as not applicable in the run: no compute
        began = time.perf_counter()
        raw = observe(case, spec, target)
        observed = time.perf_counter()
        judged(case, spec, Role.UNKNOWN, raw, references.get(case.case_id), target.prepared.version)
        compute += time.perf_counter() - began
        judging += time.perf_counter() - observed
        ran += 1
    print(json.dumps({"spec": spec, "cases": ran, "compute_s": compute, "judge_s": judging, "torch_import_s": torch_s,
                      "target_load_s": load_s, "megatron_import_s": megatron_s, "threads": torch.get_num_threads()}))


def reference_floor(case_file: str) -> None:
    """In a fresh process (`--reference-floor`): time the plain-PyTorch references once per case
    definition, as the run's judge computes them for every target."""
    started = time.perf_counter()
    import torch  # noqa: F401

    torch_s = time.perf_counter() - started
    from cases.case import Case
    from harness.engine.reference import independent, reference_side

    cases = [c for c in dict.fromkeys(Case.from_id(i) for i in json.loads(Path(case_file).read_text())) if independent(c)]
    began = time.perf_counter()
    for case in cases:
        reference_side(case)
    print(json.dumps({"spec": "references", "cases": 0, "references": len(cases), "compute_s": time.perf_counter() - began,
                      "judge_s": 0.0, "torch_import_s": torch_s, "target_load_s": 0.0, "megatron_import_s": None,
                      "threads": 1}))


def floor(case_ids: dict[str, list[str]], threads: int, at_once: int = 1) -> list[dict[str, Any]]:
    """Figure 2: one process per target and one for the references, `at_once` at a time: one
    (each has the machine's cores to itself, the best case for it), or as many as the run's
    workers (two processes on two cores slow each other by a tenth or more, memory and caches
    shared: the run cannot do better than that)."""
    # The floor's processes keep their temporary files (torch's cache folder) in `tmp`, as the run's do in its run dir.
    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp, scratch.scratch(Path(tmp)) as env:
        jobs = []
        for index, (spec, ids) in enumerate(case_ids.items()):
            case_file = Path(tmp) / f"cases-{index}.json"
            case_file.write_text(json.dumps(ids))
            jobs.append(["--floor-worker", spec, str(case_file), "--threads", str(threads)])
        case_file = Path(tmp) / "cases-all.json"
        case_file.write_text(json.dumps([i for ids in case_ids.values() for i in ids]))
        jobs.append(["--reference-floor", str(case_file)])
        return _run_at_once(jobs, at_once, Path(tmp), env)


def _run_at_once(jobs: list[list[str]], at_once: int, tmp: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """This script with each job's arguments, `at_once` processes at a time (the next starts as
    soon as any ends); each one's figures, the last line of its output (kept in `tmp`)."""
    running: dict[int, subprocess.Popen[bytes]] = {}
    pending = list(enumerate(jobs))
    while pending or running:
        while pending and len(running) < at_once:
            index, job = pending.pop(0)
            # The children hold their own copies of the files.
            with open(tmp / f"output-{index}", "wb") as output, open(tmp / f"errors-{index}", "wb") as errors:
                running[index] = subprocess.Popen([sys.executable, __file__, *job], stdout=output, stderr=errors,
                                                  cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env})
        time.sleep(0.05)
        for index in [i for i, process in running.items() if process.poll() is not None]:
            if running.pop(index).returncode:
                text = (tmp / f"errors-{index}").read_text(errors="replace")
                raise SystemExit(f"floor process {' '.join(jobs[index][:2])} failed: {text.strip()[-400:]}")
    return [json.loads((tmp / f"output-{index}").read_text(errors="replace").strip().splitlines()[-1])
            for index in range(len(jobs))]


def floor_sums(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """The floor's processes together: their compute, and their start-up (torch, target, Megatron)."""
    return (sum(f["compute_s"] for f in rows),
            sum(f["torch_import_s"] + f["target_load_s"] + (f["megatron_import_s"] or 0) for f in rows))


def floor_wall(rows: list[dict[str, Any]], parallel: int) -> tuple[float, float]:
    """The floor over `parallel` workers: its compute alone, and with each process's start-up."""
    compute, startup = floor_sums(rows)
    return compute / parallel, (compute + startup) / parallel


def ratios_per_round(floors: list[list[dict[str, Any]]], sides: dict[str, list[dict[str, Any]]],
              parallel: int) -> tuple[list[float], dict[str, list[float]]]:
    """Each round's floor + start-up, and each side's wall / that, round by round."""
    with_startup = [floor_wall(rows, parallel)[1] for rows in floors]
    return with_startup, {side: [r["wall_s"] / w for r, w in zip(runs, with_startup, strict=True)]
                          for side, runs in sides.items()}


def _startup_line(label: str, entries: list[dict[str, Any]]) -> str:
    def median(key: str) -> str:
        values = [e[key] for e in entries if e.get(key) is not None]
        return f"{statistics.median(values):.2f} s (x{len(values)})" if values else "- (none)"

    preloaded = sum(1 for e in entries if e.get("torch_preloaded"))  # forked by the run's fork server
    return (f"{label}: torch import {median('torch_import_s')}, target load {median('target_load_s')}, "
            f"megatron import {median('megatron_import_s')}  [median per process]"
            + (f"; {preloaded} of {len(entries)} forked with torch imported" if preloaded else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="issue22")
    parser.add_argument("--only", action="append", default=[], metavar="AXIS=V[,V]",
                        help="repro run's --only (e.g. client=ops); repeatable")
    parser.add_argument("--targets", help="comma-separated specs (default: the matrix's own default targets)")
    parser.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="repro run's -n; also the parallelism the floor is spread over")
    parser.add_argument("--threads-too", action="store_true",
                        help="also measure the floor with torch's default thread count (the runner uses 1)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--old", type=Path, help="an older checkout whose run is timed side by side with this one")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side (alternating order)")
    parser.add_argument("--floor-worker", nargs=2, metavar=("SPEC", "CASE_FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--reference-floor", metavar="CASE_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_worker:
        spec, case_file = args.floor_worker
        floor_worker(spec, case_file, args.threads)
        return 0
    if args.reference_floor:
        reference_floor(args.reference_floor)
        return 0
    figures: dict[str, Any] = {"load_average_before": os.getloadavg(), "cpus": os.cpu_count()}
    sides: dict[str, list[dict[str, Any]]] = {"new": []} if args.old is None else {"old": [], "new": []}
    floors: list[list[dict[str, Any]]] = []
    parallel_floors: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="harness-speed-") as tmp:
        for round_ in range(args.rounds):
            # The machine's speed drifts by a quarter within minutes: each round measures its own floor,
            # between its two runs (new, floor, old; then old, floor, new), and each run is set against it.
            order = ["new", "floor", "old"] if round_ % 2 == 0 else ["old", "floor", "new"]
            for side in (s for s in order if s in sides or s == "floor"):
                if side == "floor":
                    floors.append(floor(sides["new"][0]["case_ids"], threads=1))
                    parallel_floors.append(floor(sides["new"][0]["case_ids"], threads=1, at_once=args.workers))
                    continue
                checkout = REPO if side == "new" else args.old.resolve()
                sides[side].append(run_once(args.matrix, args.targets, args.workers, Path(tmp) / f"{side}-{round_}",
                                            args.only, checkout))
    figures["load_average_mid"] = os.getloadavg()
    parallel = max(1, min(args.workers, os.cpu_count() or 1, len(sides["new"][0]["case_ids"])))
    figures["floor_with_startup_wall_s_per_round"], figures["ratios"] = ratios_per_round(floors, sides, parallel)
    figures["parallel_floor_with_startup_wall_s_per_round"], figures["ratios_parallel_floor"] = ratios_per_round(
        parallel_floors, sides, parallel)
    figures["floor_parallel"] = parallel_floors
    # The new side's median round (the lower of two middles) gives the figures below.
    median_round = sorted(range(args.rounds), key=lambda i: figures["ratios"]["new"][i])[(args.rounds - 1) // 2]
    run = sides["new"][median_round]
    figures["run"] = {k: v for k, v in run.items() if k != "case_ids"}
    figures["walls"] = {side: [r["wall_s"] for r in runs] for side, runs in sides.items()}
    figures["cpu_s"] = {side: [r["cpu_s"] for r in runs] for side, runs in sides.items()}
    figures["floor"] = floors[median_round]
    if args.threads_too:
        figures["floor_default_threads"] = floor(run["case_ids"], threads=0)
    figures["load_average_after"] = os.getloadavg()

    compute, startup = floor_sums(figures["floor"])
    figures["floor_wall_s"], figures["floor_with_startup_wall_s"] = floor_wall(figures["floor"], parallel)
    figures["wall_over_floor"] = run["wall_s"] / figures["floor_wall_s"]
    figures["wall_over_floor_with_startup"] = run["wall_s"] / figures["floor_with_startup_wall_s"]
    figures["wall_over_in_run_compute"] = run["wall_s"] / (run["sum_case_duration_s"] / parallel)

    print(f"machine: {figures['cpus']} CPUs; load average (1 min) before {figures['load_average_before'][0]:.2f}, "
          f"after the run {figures['load_average_mid'][0]:.2f}, at the end {figures['load_average_after'][0]:.2f}")
    only = "".join(f" --only {o}" for o in args.only)
    print(f"repro run --matrix {args.matrix}{only} -n {args.workers}: {run['wall_s']:.1f} s wall, {run['cases']} cases over "
          f"{len(run['targets'])} targets ({', '.join(run['targets'])}): {run['cases_per_s']:.0f} cases/s; "
          f"the records' own durations sum to {run['sum_case_duration_s']:.1f} s; exit {run['exit']}")
    ran = sum(f["cases"] for f in figures["floor"])
    refs = next((f for f in figures["floor"] if f["spec"] == "references"), {"references": 0, "compute_s": 0.0})
    judge = sum(f["judge_s"] for f in figures["floor"])
    print(f"the run's CPU (user + system, every process it started): {run['cpu_s']:.1f} s, against the floor's "
          f"compute and start-up {compute + startup:.1f} s")
    print(f"compute floor: the same {ran} cases observed and judged, one process per target, torch on 1 thread, "
          f"plus {refs['references']} references once ({refs['compute_s']:.1f} s; the judging {judge:.1f} s): "
          f"{compute:.1f} s ({1e3 * compute / max(1, ran):.2f} ms/case), over {parallel} parallel workers "
          f"{figures['floor_wall_s']:.1f} s; with each process's start-up {figures['floor_with_startup_wall_s']:.1f} s")
    print(f"wall / floor: {figures['wall_over_floor']:.2f}; wall / (floor + start-up): "
          f"{figures['wall_over_floor_with_startup']:.2f}")
    # What the harness adds to each case, on average, beyond its compute and the processes' start-up.
    figures["overhead_ms_per_case"] = 1e3 * parallel * (run["wall_s"] - figures["floor_with_startup_wall_s"]) / max(1, ran)
    print(f"the harness's overhead: {figures['overhead_ms_per_case']:.2f} ms a case of {parallel} workers' time "
          "((wall - (floor + start-up)) x workers / cases)")
    # The floor runs minutes apart from the run, maybe under another load: the run's own per-case
    # times show how much of the gap is the machine rather than the harness.
    in_run = run["sum_case_duration_s"] / parallel
    print(f"the run's own case durations over {parallel} workers: {in_run:.1f} s "
          f"({run['sum_case_duration_s'] / max(1, compute):.2f}x the floor's compute); wall / that: "
          f"{run['wall_s'] / in_run:.2f}")
    if "floor_default_threads" in figures:
        default = figures["floor_default_threads"]
        other = sum(f["compute_s"] for f in default)
        print(f"the same floor with torch's default threads ({default[0]['threads']}): {other:.1f} s "
              f"({other / compute:.2f}x the 1-thread floor)")
    for key, label, per_round in (("ratios", "one at a time", "floor_with_startup_wall_s_per_round"),
                                  ("ratios_parallel_floor", f"{parallel} at a time, as the run runs them",
                                   "parallel_floor_with_startup_wall_s_per_round")):
        ratio_text = {side: ", ".join(f"{r:.2f}" for r in figures[key][side]) for side in sides}
        print(f"wall / (floor + start-up) per round, the floor's processes {label} "
              f"({', '.join(f'{w:.1f}' for w in figures[per_round])} s): "
              + "; ".join(f"{side} {ratio_text[side]}" for side in sides)
              + "; medians (lower of two middles): "
              + ", ".join(f"{side} {statistics.median_low(figures[key][side]):.2f}" for side in sides))
    if args.old is not None:
        old_wall, new_wall = (statistics.median_low(figures["walls"][side]) for side in ("old", "new"))
        figures["old_wall_over_floor_with_startup"] = statistics.median_low(figures["ratios"]["old"])
        figures["new_over_old_wall"] = new_wall / old_wall
        print(f"side by side with {args.old} ({args.rounds} round(s), alternating): walls old "
              f"{', '.join(f'{w:.1f}' for w in figures['walls']['old'])} s, new "
              f"{', '.join(f'{w:.1f}' for w in figures['walls']['new'])} s; medians {old_wall:.1f} / {new_wall:.1f} s; "
              f"wall new / old: {figures['new_over_old_wall']:.3f}")
        old_cpu, new_cpu = (statistics.median_low(figures["cpu_s"][side]) for side in ("old", "new"))
        print(f"CPU of each run and every process it started (user + system): old "
              f"{', '.join(f'{c:.1f}' for c in figures['cpu_s']['old'])} s, new "
              f"{', '.join(f'{c:.1f}' for c in figures['cpu_s']['new'])} s; new / old (lower medians): "
              f"{new_cpu / old_cpu:.3f}")
    print(_startup_line("worker start-up in the run", list(run["worker_startups"].values())))
    print(_startup_line("start-up of the floor processes", figures["floor"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
