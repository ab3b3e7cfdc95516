"""Run a Megatron client once in a fresh process (one TE target and one Megatron per
process), and report as JSON on stdout. `run_in_subprocess` is the parent's side."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from harness.errors import TargetLoadError
from harness.megatron.source import PreparedMegatron
from harness.targets import PreparedTarget


def main() -> None:
    prepared = PreparedTarget.from_json(sys.argv[1])
    megatron_spec = PreparedMegatron.from_json(sys.argv[2])
    client, recompute = sys.argv[3], (sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None)
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

        report["minimal"] = run_client_minimal(target, megatron, client, recompute)
    except TargetLoadError as exc:
        report["load_error"] = str(exc)
    print(json.dumps(report))


def run_in_subprocess(prepared: PreparedTarget, megatron: PreparedMegatron, client: str,
                      recompute: str | None = None, timeout: float = 600) -> dict[str, Any]:
    command = [sys.executable, "-m", "harness.megatron.worker", prepared.to_json(), megatron.to_json(), client,
               recompute or ""]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
    if result.returncode != 0 or not result.stdout.strip():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"load_error": f"megatron worker failed (exit {result.returncode}): {last}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
