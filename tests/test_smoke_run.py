"""`repro run --matrix smoke` end to end over the four default targets."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import repro


def test_smoke_matrix_end_to_end(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"  # the run's processes' temporary directory: nothing may be left in it
    scratch.mkdir()
    out = tmp_path / "out"
    result = repro("run", "--matrix", "smoke", "--out", str(out), check_rc=0, env={**os.environ, "TMPDIR": str(scratch)})
    assert not list(scratch.iterdir()), "a run left files outside its run dir"
    assert "Warning" not in result.stdout + result.stderr  # the judge's references warned on the terminal
    assert "te-2.13.0+backport matches te-2.16.0 on every case both ran" in result.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["schema"] == "repro.run/2" and run["complete"]
    verdicts = {(r["target"], r["verdict"]) for r in run["results"]}
    assert ("te-2.13.0", "reproduced") in verdicts
    assert ("te-2.13.0+backport", "fixed") in verdicts
    assert not any(r["verdict"] in ("other_failure", "regression", "harness_error", "unexpected_pass")
                   for r in run["results"])
    roles = {t["spec"]: t["roles"]["issue22"] for t in run["environment"]["targets"]}
    assert roles == {"te-2.13.0": "unpatched", "te-2.13.0+backport": "patched", "te-2.16.0": "fixed_upstream",
                     "te-2.20.2": "fixed_upstream"}
    crash = next(r for r in run["results"] if r["target"] == "te-2.13.0" and r["outcome"] == "crash")
    assert crash["error"]["location"].startswith("transformer_engine/pytorch/ops/fuser.py:")
    # The CUDA calls the CPU backend answered for TE's files, per case, with TE's file and line; listed per
    # target in report.md (a machine detail: the verdict report leaves it out).
    calls = {call for r in run["results"] for call in r.get("device_calls") or []}
    assert any(c.startswith("torch.is_autocast_enabled() at transformer_engine/pytorch/ops/") for c in calls), calls
    assert all(" at transformer_engine/pytorch/" in c for c in calls), calls
    report = (out / "report.md").read_text()
    answered = next(line for line in report.splitlines() if "device calls the CPU backend answered" in line)
    assert "`torch.is_autocast_enabled() at transformer_engine/pytorch/ops/" in answered, answered
    html = (out / "report.html").read_text()  # and in report.html, each with its count of cases
    listed = html.split('<ul id="device-calls">', 1)[1].split("</ul>", 1)[0]
    assert "<code>te-2.13.0</code>" in listed and "<code>torch.is_autocast_enabled() at transformer_engine/" in listed
    verdict = repro("report", str(out), "--format", "verdict-md", check_rc=0).stdout
    assert "Device calls" not in verdict
