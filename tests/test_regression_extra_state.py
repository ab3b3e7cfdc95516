"""extra_state_pickle: a crafted `_extra_state` pickle runs code on load up to 2.16.0 and
again in 2.17.0; 2.16.1, 2.17.1 and our patch refuse it, which the regression declares as
what "fixed" looks like."""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from cases.case import Case
from cases.regressions import REGRESSIONS
from harness.model import Role
from harness.runner.roles import release_role
from tests.conftest import repro

REGRESSION = REGRESSIONS["extra_state_pickle"]


def test_declared_ranges_are_a_fix_that_came_and_went() -> None:
    assert str(REGRESSION.affected) == "<2.16.1 || ==2.17.0"
    roles = [release_role(REGRESSION, Version(v))[0] for v in ("2.13.0", "2.16.0", "2.16.1", "2.17.0", "2.17.1")]
    assert roles == [Role.UNPATCHED, Role.UNPATCHED, Role.FIXED_UPSTREAM, Role.UNPATCHED, Role.FIXED_UPSTREAM]
    assert list(REGRESSION.axes) == ["pipeline", "checkpoint"]  # its own axes: no grad mode, no recompute
    assert Case.from_id("extra_state_pickle:rmsnorm-crafted_pickle").checkpoint == "crafted_pickle"


def test_reproduced_on_2_17_0_and_refused_where_fixed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    repro("run", "--matrix", "extra_state_pickle", "--only", "pipeline=rmsnorm", "--out", str(out), "-n", "1",
          "--targets", "te-2.17.0,te-2.17.0+extra_state_refuse_globals,te-2.16.1", check_rc=0)
    records = {(r["target"], r["checkpoint"]): r for r in
               (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())}
    crafted = {spec: records[(spec, "crafted_pickle")] for spec in
               ("te-2.17.0", "te-2.17.0+extra_state_refuse_globals", "te-2.16.1")}
    assert crafted["te-2.17.0"]["verdict"] == "reproduced"
    assert crafted["te-2.17.0"]["observations"] == {"payload_executed": True}
    assert crafted["te-2.17.0"]["details"]["observations"] == ["payload_executed: True, reference False"]
    patched, upstream = crafted["te-2.17.0+extra_state_refuse_globals"], crafted["te-2.16.1"]
    assert (patched["role"], patched["verdict"], patched["error"]["type"]) == ("patched", "fixed", "UnpicklingError")
    assert patched["error"]["location"].startswith("transformer_engine/pytorch/ops/op.py:")
    assert (upstream["role"], upstream["verdict"]) == ("fixed_upstream", "fixed")
    assert upstream["error"]["location"].startswith("transformer_engine/pytorch/_extra_state.py:")
    assert not patched["observations"]["payload_executed"] and not upstream["observations"]["payload_executed"]
    # A state dict TE saved itself still loads, and the loaded module computes the reference's outputs.
    assert {r["verdict"] for (_, kind), r in records.items() if kind == "round_trip"} == {"unaffected"}
    assert all(r["standalone"] for r in records.values())
    # The report names the declared ranges, not one "fixed in" that 2.17.0 contradicts.
    assert "affected releases `<2.16.1 || ==2.17.0`" in (out / "report.md").read_text()


def test_standalone_script_writes_the_scenario_steps() -> None:
    script = repro("show", "extra_state_pickle:rmsnorm-crafted_pickle", "--target", "te-2.17.0", "--script",
                   "--standalone", check_rc=0).stdout
    assert "loaded.load_state_dict(state)" in script and "pickle.dumps(Crafted())" in script
    compile(script, "case.py", "exec")
