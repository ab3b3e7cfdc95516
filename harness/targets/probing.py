"""Run `harness.targets.probe` on a prepared target in a fresh interpreter.

The probe's report comes back through a file of its own (`--report FILE`), never stdout:
a target that prints at import or at exit cannot garble it. The probe runs in its own
process group, which is ended as a whole when it overruns the timeout (a target that
hangs or loops at import), so that a child it started cannot hold the command up either. It
runs in a sandbox (harness.runner.sandbox) whose only writable folder, beside its private tmp,
is the probe's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.runner import sandbox, scratch
from harness.targets import PreparedTarget

PROBE_TIMEOUT_S = 300


def probe(prepared: PreparedTarget, minimal: bool = False, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    if not sandbox.disabled() and (refused := sandbox.refusal()):
        return {"load_error": f"not loaded: this kernel refuses the sandbox ({refused}); --no-sandbox loads it "
                              "unsandboxed"}
    with tempfile.TemporaryDirectory(prefix="repro-probe-") as folder, scratch.scratch(Path(folder)) as scratch_env:
        report, log = Path(folder) / "report.json", Path(folder) / "output.log"
        command = [sys.executable, "-m", "harness.targets.probe", prepared.to_json(), "--report", str(report)]
        command += ["--minimal"] if minimal else []
        command = sandbox.command(command, writable=[folder])  # the report comes back through the folder
        # The probe imports a target, which may be a user's own tree: never write bytecode into it.
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **scratch_env}
        with open(log, "wb") as output:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                with contextlib.suppress(ProcessLookupError):  # the probe's own children too
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if code is None:
            return {"load_error": f"probe timed out after {timeout:g} s (the target hangs or loops at import, or "
                                  "in the scenario); raise --load-timeout if it is only slow"}
        try:
            return json.loads(report.read_text())
        except (OSError, ValueError):
            lines = log.read_bytes().decode(errors="replace").strip().splitlines() or ["no output"]
            return {"load_error": f"probe process failed (exit {code}): {lines[-1][:300]}"}
