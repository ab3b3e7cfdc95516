"""A target session's worker ends right after xdist's last event, without Python's teardown
(seconds with torch, TE and Megatron loaded, which the controller would wait for), and
loses nothing by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.runner import sandbox
from harness.runner.rundir import session_name
from tests.conftest import REPO
from tests.teardown_probe import ENV, PLUGIN


def test_the_worker_skips_teardown_after_its_last_event(tmp_path: Path) -> None:
    probe = tmp_path / "probe.txt"
    out = tmp_path / "run"
    # Unsandboxed: the test hook writes from the worker into a file outside, which a sandbox refuses.
    env = {**os.environ, ENV: str(probe), "PYTEST_PLUGINS": PLUGIN, sandbox.DISABLE_ENV: "1"}
    result = subprocess.run([sys.executable, "-m", "repro", "run", "--matrix", "smoke", "--only", "pipeline=rmsnorm",
                             "--targets", "te-2.20.2", "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    notes = probe.read_text().split()
    assert notes[1::2] == ["sessionfinish"], notes  # one worker, that finished its session, then no teardown
    log = (out / "sessions" / f"{session_name('te-2.20.2')}.log").read_text()
    assert "node down" not in log and "crashed" not in log, log  # xdist had its last event first
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and len(run["results"]) == 6 and not run["problems"]
    startup = (out / "sessions" / f"{session_name('te-2.20.2')}.startup.jsonl").read_text().splitlines()
    assert json.loads(startup[-1])["pid"] == int(notes[0])  # the worker's last notice, sent after its last case
