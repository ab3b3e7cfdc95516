"""The review's one word (harness/runner/decision.py), tested over its whole state space with
hypothesis: the degenerate states first (nothing loads, nothing judged, every patch conflicting,
every failure standing), then any state. The invariants are written here from the rules' meaning,
not read back from the table: PASS needs a head that loads, both sides judged, no carried fix lost,
no new or changed failure and no lost coverage; the first line is short and names the deciding
reason; and every output of a review (review.md, the terminal line, junit, report.md, the run's
status, the exit status) carries the same word."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from harness.runner import decision as d
from harness.runner.decision import PatchState, RegressionState, ReviewState, SideState, SignatureGroup
from harness.runner.status import summarize
from repro import formats
from repro.render_md import plain
from repro.render_review import render_review, terminal_line
from repro.review import review, verdict_of

IDS = ("issue22", "saved_tensors_twice")
sides = st.builds(SideState, loads=st.booleans(), load_cause=st.sampled_from(["ops/fuser.py:8 ImportError: x", ""]),
                  cases=st.integers(0, 3), judged=st.integers(0, 3), unjudged_cause=st.sampled_from(["", "why"]),
                  kernels=st.sampled_from(["the harness's CPU stand-ins", "the tree's own module", "?"]))
regressions = st.builds(RegressionState, id=st.sampled_from(IDS), base=st.sampled_from(d.REGRESSION_STATES),
                        head=st.sampled_from(d.REGRESSION_STATES), symptom=st.integers(0, 3),
                        affected=st.integers(0, 3))
patches = st.builds(PatchState, patch=st.sampled_from(["backport", "saved_tensors_once"]),
                    regression=st.sampled_from(IDS), base=st.sampled_from(d.PATCH_STATES),
                    head=st.sampled_from(d.PATCH_STATES), head_fix=st.booleans(),
                    where=st.sampled_from(["", "ops/fuser.py:138"]))
groups = st.builds(SignatureGroup, change=st.sampled_from(d.CHANGES),
                   signature=st.sampled_from(["other_failure: crash ValueError at ops/basic/gemm.py", "x" * 300]),
                   cases=st.integers(1, 700), regression=st.sampled_from(IDS), provider=st.sampled_from(["", "fork"]))
states = st.builds(ReviewState, base=sides, head=sides, regressions=st.lists(regressions, max_size=3).map(tuple),
                   patches=st.lists(patches, max_size=3).map(tuple), signatures=st.lists(groups, max_size=4).map(tuple),
                   missing=st.sampled_from(["", "INCOMPLETE run: 3 case results missing"]),
                   other=st.lists(st.sampled_from(["UNMET EXPECTATION issue22", "head: a target problem"]),
                                  max_size=2).map(tuple),
                   accept_lost_coverage=st.booleans())

NOTHING_LOADS = ReviewState(base=SideState(loads=False, load_cause="softmax.py:11 ImportError", cases=2416),
                            head=SideState(loads=False, load_cause="softmax.py:11 ImportError", cases=2416))
NOTHING_JUDGED = ReviewState(base=SideState(cases=10, judged=0, unjudged_cause="not applicable"),
                             head=SideState(cases=10, judged=0, unjudged_cause="not applicable"))
JUDGED = SideState(cases=10, judged=10)
EVERY_PATCH_CONFLICTS = ReviewState(
    base=JUDGED, head=JUDGED, regressions=(RegressionState("issue22", d.REPRODUCES, d.REPRODUCES, 3, 3),),
    patches=(PatchState("backport", "issue22", d.APPLIES, d.CONFLICTS, where="ops/fuser.py:138"),))
EVERY_FAILURE_STANDING = ReviewState(base=JUDGED, head=JUDGED, signatures=(
    SignatureGroup(d.STANDING, "other_failure: crash ValueError at ops/basic/gemm.py", 696, "issue22"),))


def fix_lost(state: ReviewState) -> bool:
    heads = {r.id: r.head for r in state.regressions}
    return any(p.base in ("applies", "present") and p.head in ("conflicts", "stale") and not p.head_fix
               and heads.get(p.regression, "unjudged") not in ("fixed", "fixed_upstream", "predates")
               for p in state.patches)


@given(states)
@example(NOTHING_LOADS)
@example(NOTHING_JUDGED)
@example(EVERY_PATCH_CONFLICTS)
@example(EVERY_FAILURE_STANDING)
@example(ReviewState())  # the empty state: nothing ran at all
def test_the_decision_holds_its_invariants(state: ReviewState) -> None:
    decided = d.decide(state)
    assert len(decided.headline) <= d.HEADLINE_LIMIT
    assert decided.headline.startswith(f"{d.SYMBOL[decided.outcome]} ") and decided.word in decided.headline
    assert (decided.status == "PASS") == (decided.exit_code == 0) == (decided.outcome is d.Outcome.MERGE)
    if decided.status == "PASS":
        assert state.head.loads and state.base.judged and state.head.judged
        assert not fix_lost(state) and not state.missing and not state.other
        assert not any(g.change in ("new", "changed") for g in state.signatures)
        assert state.accept_lost_coverage or not any(g.change == "stopped running" and not g.provider
                                                     for g in state.signatures)
        assert not any(r.head == "reproduces" and r.base in ("fixed", "fixed_upstream", "predates")
                       for r in state.regressions)
    else:  # the first line names the first rule that matched, and its reason leads the list
        first = next(r for r in d.RULES if r.detail(state) is not None)
        assert decided.rule == first.name and decided.reasons[0] == first.detail(state)
        assert decided.headline.endswith("…") or decided.headline.endswith(" ".join(decided.reasons[0].split()))
    if not state.head.loads:
        assert decided.status != "PASS"
    if not (state.base.judged and state.head.judged):  # what stands unjudged is not "unchanged by this sync"
        assert decided.standing == ""


def test_the_degenerate_states_have_their_words() -> None:
    assert d.decide(NOTHING_LOADS).headline == "⚠ Cannot judge: neither tree loads: softmax.py:11 ImportError"
    # the load failure's errors are the same on both sides, yet nothing stands: nothing was judged
    # (ROCm's two commits read "standing: 2680 failures in 5 signatures, unchanged by this sync")
    unjudged_standing = replace(NOTHING_LOADS, signatures=(SignatureGroup("standing", "harness_error: softmax.py:11", 2680),))
    assert d.decide(unjudged_standing).standing == ""
    assert d.decide(NOTHING_JUDGED).headline == "⚠ Cannot judge: base and head judged 0 of 10 cases: not applicable"
    assert d.decide(EVERY_PATCH_CONFLICTS).headline == ("❌ Do not merge: patches/backport.patch no longer applies"
                                                        " (ops/fuser.py:138) and issue22 is still upstream: port it")
    standing = d.decide(EVERY_FAILURE_STANDING)
    assert standing.status == "PASS" and standing.standing == \
        "standing: 696 failures in 1 signature, unchanged by this sync"


def test_every_rule_of_the_table_decides_some_state() -> None:
    """Each row of the table, with a state where it is the first match (one example per row)."""
    head_lost = ReviewState(base=JUDGED, head=SideState(loads=False, load_cause="ops/fuser.py:8 SyntaxError", cases=4))
    bug_back = ReviewState(base=JUDGED, head=JUDGED,
                           regressions=(RegressionState("issue22", d.FIXED, d.REPRODUCES, 3, 3),),
                           patches=(PatchState("backport", "issue22", d.PRESENT, d.APPLIES),))
    missing = ReviewState(base=JUDGED, head=JUDGED, missing="INCOMPLETE run: 3 case results missing")
    new = (SignatureGroup(d.NEW, "regression: crash RuntimeError at ops/fuser.py", 4, "issue22"),)
    kernels = ReviewState(base=JUDGED, head=SideState(cases=10, judged=10, kernels="the tree's own module"),
                          signatures=new)
    changed = ReviewState(base=JUDGED, head=JUDGED, signatures=new)
    other = ReviewState(base=JUDGED, head=JUDGED, other=("UNMET EXPECTATION issue22 on head",))
    kernels_failed = ReviewState(base=JUDGED, head=JUDGED, signatures=(
        SignatureGroup(d.NEW, "regression: crash RuntimeError at plugin/core/manager.py [completion]: no rmsnorm_bwd_add",
                       520, "issue22", "plugin/core/"),))
    standing_in_kernels = ReviewState(base=JUDGED, head=JUDGED, signatures=(
        SignatureGroup(d.STANDING, "other_failure: crash NotImplementedError", 520, "issue22", "plugin/core/"),))
    by_rule = {"head_does_not_load": head_lost, "nothing_judged": NOTHING_JUDGED, "fix_lost": EVERY_PATCH_CONFLICTS,
               "bug_back": bug_back, "incomplete": missing, "kernels_differ": kernels, "changed_failures": changed,
               "kernels_failed": kernels_failed, "other": other, "merge": standing_in_kernels}
    assert set(by_rule) == {r.name for r in d.RULES}
    for name, state in by_rule.items():
        assert d.decide(state).rule == name, (name, d.decide(state))
    assert d.decide(bug_back).headline == "❌ Do not merge: issue22 is back at head (its symptom on 3 of 3 cases);" \
                                          " re-apply patches/backport.patch: it applies"
    assert d.decide(kernels_failed).headline == "❌ Needs a look: 520 cases failed in head's own kernels" \
                                                " (plugin/core/), not judged: no rmsnorm_bwd_add"
    assert d.decide(changed).headline == "❌ Needs a look: 4 new failures in 1 signature (top: regression: crash" \
                                         " RuntimeError at ops/fuser.py)"


def test_one_advice_per_patch() -> None:
    """The advice a review states once: the drop of a stale patch whose regression head fixed upstream
    is "drop" in the table and the list alike (it read "drop" and "still needed and conflicts")."""
    stale = PatchState("saved_tensors_once", "saved_tensors_twice", d.APPLIES, d.STALE, head_fix=True)
    fixed = RegressionState("saved_tensors_twice", d.REPRODUCES, d.FIXED_UPSTREAM)
    assert d.patch_advice(stale, fixed) == ("drop", "drop saved_tensors_once: upstream's fix is present at head")
    conflicting = PatchState("backport", "issue22", d.APPLIES, d.CONFLICTS, where="ops/fuser.py:138")
    action, text = d.patch_advice(conflicting, RegressionState("issue22", d.REPRODUCES, d.FIXED))
    assert action == "check by hand" and "no marker knows" in text


# ---- every output carries the same word, on runs drawn from the space ----

VERDICTS = ("reproduced", "fixed", "unaffected", "other_failure", "regression", "harness_error", "not_applicable")


def _record(spec: str, n: int, verdict: str, load_error: bool) -> dict[str, Any]:
    outcome = {"reproduced": "crash", "other_failure": "crash", "regression": "wrong_output",
               "harness_error": "harness_error", "not_applicable": "not_applicable"}.get(verdict, "pass")
    if load_error:
        verdict = outcome = "harness_error"
    return {"target": spec, "case_id": f"issue22:c{n}", "regression": "issue22", "outcome": outcome,
            "verdict": verdict, "expected": "affected" if n % 2 else "unaffected", "symptom": verdict == "reproduced",
            "failed_checks": ["load"] if load_error else (["completion"] if outcome == "crash" else []),
            "error": {"type": "RuntimeError", "location": "transformer_engine/pytorch/ops/fuser.py:141",
                      "message": "m"} if outcome == "crash" else None,
            "note": f"target {spec}: importing transformer_engine.pytorch failed at x.py:1: ImportError: y"
            if load_error else None, "verdict_reason": "", "role": "unknown", "duration_s": 0.0}


@st.composite
def runs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    cases = draw(st.integers(1, 4))
    results, targets = [], []
    for spec in ("base-tree", "head-tree"):
        broken = draw(st.booleans())
        verdicts = draw(st.lists(st.sampled_from(VERDICTS), min_size=cases, max_size=cases))
        results += [_record(spec, n, v, broken) for n, v in enumerate(verdicts)]
        targets.append({"spec": spec, "version": "2.13.0", "fuser_sha": "0" * 12, "patch_status": "none",
                        "backend": "cpu", "source": "s", "roles": {"issue22": draw(st.sampled_from(
                            ["unpatched", "fixed_upstream", "predates", "unknown"]))},
                        "description": "load error: x" if broken else "TE as shipped; kernels: the harness's CPU"
                        " stand-ins (3 kernels, of 9 names the target reads); TE's own: X"})
    text = draw(st.sampled_from(["applies", "in the tree", "conflict", "stale"]))
    assessed = {spec: [{"patch": "backport", "fixes": ["issue22"], "text": t, "fix": "not found",
                        "text_detail": "hunk 1 of 6 fails at transformer_engine/pytorch/ops/fuser.py:138",
                        "fix_detail": ""}] for spec, t in (("base-tree", "applies"), ("head-tree", text))}
    complete = draw(st.booleans())
    run = {"matrix": "issue22", "complete": complete, "missing": 0 if complete else 2, "results": results,
           "environment": {"targets": targets, "machine": "m", "torch": "t", "python": "p", "platform": "x"},
           "regressions": [{"id": "issue22", "title": "t", "upstream": "", "first_fixed": "2.16.0"}],
           "target_problems": [], "not_run": []}
    return run, assessed


@given(runs())
def test_every_output_says_the_decision(drawn: tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]) -> None:
    run, assessed = drawn
    found = review(run, "base-tree", "head-tree", assessed)
    run["review"] = verdict_of(found)
    word = found["outcome"]
    assert render_review(found).splitlines()[0] == f"# {plain(found['headline'])}"
    assert word in terminal_line(found, "review.md")
    summary = summarize(run)
    assert summary["status"] == found["status"] and (found["exit_code"] == 0) == (found["status"] == "PASS")
    assert plain(found["headline"]) in formats.render(run, "md")
    root = ET.fromstring(formats.render(run, "junit").encode())
    verdict = root.find(".//testcase[@classname='repro_verdict']")
    failure = verdict.find("failure")
    assert (failure is None) == (found["status"] == "PASS")
    if failure is not None:
        assert word in failure.get("message")
    counted = {tuple(pair) for pair in found["failing"]}
    failures = [c for c in root.findall(".//testcase") if c.find("failure") is not None or c.find("error") is not None]
    assert len(failures) == len(counted) + (failure is not None) + sum(
        1 for c in root.findall(".//testcase/error[@type='missing']"))
    # nothing judged is never a pass
    for side in ("base-tree", "head-tree"):
        if not any(r["target"] == side and r["verdict"] in ("reproduced", "fixed", "unaffected", "other_failure",
                                                             "regression") for r in run["results"]):
            assert found["status"] == "FAIL"


def test_the_readme_shows_the_table_as_it_is() -> None:
    from tests.conftest import REPO

    text = (REPO / "README.md").read_text()
    shown = text.split("<!-- decision-table:", 1)[1].split("\n", 1)[1].split("<!-- /decision-table -->")[0]
    assert shown.strip() == d.rules_markdown()


def test_junit_suites_name_no_machine_path_and_stay_apart() -> None:
    from repro.render_junit import suite_names

    specs = ["path:/home/me/a/te", "path:/home/me/b/te", f"path:/srv/fork@{'ab' * 20}+backport", "te-2.13.0"]
    names = suite_names(specs, {})
    assert list(names.values()) == ["path:te", "path:te (2)", "path:fork@abababababab+backport", "te-2.13.0"]
    assert suite_names(specs[:1], {specs[0]: "head"}) == {specs[0]: "head"}
