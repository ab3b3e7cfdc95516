"""Run Megatron client scenarios in a fresh process (one TE target and one Megatron per
process), and report as JSON on stdout. `run_in_subprocess` is the parent's side.

Bytecode writing is off from the start, so neither the TE tree nor Megatron's is written to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from harness.errors import TargetLoadError, UsageError
from harness.megatron.source import PreparedMegatron
from harness.runner import sandbox, scratch
from harness.targets import PreparedTarget


def main() -> None:
    sys.dont_write_bytecode = True
    prepared = PreparedTarget.from_json(sys.argv[1])
    megatron_spec = PreparedMegatron.from_json(sys.argv[2])
    scenarios: list[list[str | None]] = json.loads(sys.argv[3])
    report: dict[str, Any] = {"load_error": None}
    try:
        started = time.perf_counter()
        from harness.targets.loader import load

        target = load(prepared)
        loaded_te = time.perf_counter()
        from harness.megatron.loader import load_megatron

        megatron = load_megatron(megatron_spec, target)
        report.update(target_description=target.description, megatron_description=megatron.description,
                      te_load_s=round(loaded_te - started, 3), megatron_import_s=megatron.import_s)
        from harness.megatron.minimal import run_client_minimal

        report["results"] = [run_client_minimal(target, megatron, client or "", recompute)
                             for client, recompute in scenarios]
    except (TargetLoadError, UsageError) as exc:  # UsageError: a client this target cannot build
        report["load_error"] = str(exc)
    print(json.dumps(report))


def run_in_subprocess(prepared: PreparedTarget, megatron: PreparedMegatron,
                      scenarios: list[tuple[str, str | None]], timeout: float = 600,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
    """Each (client, recompute) in one worker; report["results"] holds one result per scenario."""
    command = [sys.executable, "-m", "harness.megatron.worker", prepared.to_json(), megatron.to_json(),
               json.dumps([list(s) for s in scenarios])]
    with scratch.temporary() as scratch_env:
        result = subprocess.run(sandbox.command(command), capture_output=True, text=True, check=False, timeout=timeout,
                                env={**(env if env is not None else os.environ), **scratch_env})
    if result.returncode != 0 or not result.stdout.strip():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"load_error": f"megatron worker failed (exit {result.returncode}): {last}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
