"""Run `harness.targets.probe` on a prepared target in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from harness.targets import PreparedTarget


def probe(prepared: PreparedTarget, minimal: bool = False, timeout: float = 300) -> dict[str, Any]:
    command = [sys.executable, "-m", "harness.targets.probe", prepared.to_json()] + (["--minimal"] if minimal else [])
    # The probe imports a target, which may be a user's own tree: never write bytecode into it.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout, env=env)
    if result.returncode != 0 or not result.stdout.strip():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"load_error": f"probe process failed (exit {result.returncode}): {last}"}
    return json.loads(result.stdout.strip().splitlines()[-1])
