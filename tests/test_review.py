"""The upstream-sync review, on a fork built here with real git from the cached release trees
(tests/forks.py): declared expectations, the patch in two parts, `repro review`, `repro diff`
with --map, and reports that fit a pull request."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cases.regressions import REGRESSIONS
from harness import targets
from harness.model import Role
from harness.runner.roles import role_of
from harness.targets import patching, sources
from repro import formats, reports
from repro.render_md import PR_LIMIT
from tests.conftest import REPO, repro
from tests.forks import FUSER, Fork, build_fork, git

# Narrow selections (5 and 20 cases per target) keep each run to seconds.
EXPOSING = ["--matrix", "issue22", "--only", "pipeline=extra_output_only", "--only", "client=ops", "--only",
            "dtype=float32", "--only", "recompute=none", "--only", "params=trainable", "--only", "grad_mode=no_grad",
            "--only", "sequence=single", "-n", "1"]
TWO_PIPELINES = ["--matrix", "issue22", "--only", "pipeline=identity,rmsnorm", "--only", "client=ops", "--only",
                 "dtype=float32", "--only", "recompute=none", "--only", "params=trainable", "--only",
                 "grad_mode=no_grad,enabled", "--only", "sequence=single", "-n", "1"]
ISSUE22 = REGRESSIONS["issue22"]
# Each tree's own fuser tests, in upstream's style (a device defaulting to cuda, placed on the CPU).
UPSTREAM_STYLE_TESTS = '''
import torch
import transformer_engine.pytorch as te

class TestBasicOps:
    def test_identity(self, device="cuda"):
        x = torch.arange(4.0, device=device)
        torch.testing.assert_close(te.ops.Identity()(x), x)

    def test_bias(self, device="cuda"):
        assert te.ops.Bias(4, device=device)(torch.ones(2, 4, device=device)).shape == (2, 4)
'''


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> Fork:
    return build_fork(tmp_path_factory.mktemp("sync"), sources.cache_dir())


def _prepare(spec: str, **kwargs: Any) -> targets.PreparedTarget:
    return targets.prepare(spec, sources.cache_dir(), **kwargs)


# ---- declared expectations and roles ----

def test_a_dev_version_without_a_declaration_is_unknown_never_unpatched(fork: Fork, tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    lost = _prepare(fork.spec(fork.lost_fix), fork_config=str(empty))
    assert lost.version == "2.16.0.dev0" and lost.expectations == {}
    role, why = role_of(ISSUE22, lost)
    assert role is Role.UNKNOWN and "not a release" in why  # was `unpatched`, from the version number


def test_declared_expectation_decides_the_role(fork: Fork, tmp_path: Path) -> None:
    lost = _prepare(fork.spec(fork.lost_fix))  # the fork's own .te-repro.toml declares issue22 fixed
    assert lost.expectations == {"issue22": "fixed"}
    role, why = role_of(ISSUE22, lost)
    assert role is Role.FIXED_UPSTREAM and why.startswith("declared fixed") and "no fix recognised" in why
    affected = tmp_path / "affected.toml"
    affected.write_text('[expect]\nissue22 = "affected"\n')
    assert role_of(ISSUE22, _prepare(fork.spec(fork.synced), fork_config=str(affected)))[0] is Role.UNPATCHED
    bad = tmp_path / "bad.toml"
    bad.write_text('[expect]\nissue99 = "fixed"\n')
    result = repro("targets", f"path:{fork.repo}", "--fork-config", str(bad), check_rc=2)
    assert "expect.issue99: unknown regression" in result.stderr and "\n" not in result.stderr.strip()


def test_synced_tree_that_lost_the_fix_declared_fixed_fails_the_run(fork: Fork, tmp_path: Path) -> None:
    spec = fork.spec("lost-fix")
    result = repro("run", *EXPOSING, "--targets", spec, "--out", str(tmp_path / "run"))
    assert result.returncode == 1, result.stdout + result.stderr
    line = f"REGRESSION issue22 on {spec}: declared fixed, yet it fails 3 of 3 affected cases"
    assert line in result.stderr and line in result.stdout  # stderr, and the status line's headline
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert {r["verdict"] for r in run["results"] if r["expected"] == "affected"} == {"regression"}
    assert run["started_at"] and isinstance(run["elapsed_s"], float)  # both were null in every run.json
    assert f"git {fork.lost_fix[:12]} (lost-fix), clean" in result.stdout  # provenance in the status line
    assert line in (tmp_path / "run" / "report.md").read_text()


# ---- the patch in two parts ----

def test_patch_status_across_the_sync(fork: Fork) -> None:
    backport = patching.load_patch("backport")

    def parts(commit: str) -> patching.Assessment:
        return patching.assess(Path(_prepare(fork.spec(commit)).root), backport)

    before_fix = parts(fork.upstream_base)
    assert (before_fix.text, before_fix.fix) == ("applies", "not found")
    assert before_fix.advice("backport") == "backport is still needed and applies"
    ours = parts(fork.fork_base)  # the fork's own backport commit: the marker must not mistake it for upstream's
    assert (ours.text, ours.fix) == ("in the tree", "our patch in the tree")
    synced = parts(fork.synced)
    assert synced.text == "stale" and synced.fix == "upstream marker"  # was `already-applied` by marker
    assert "hunk 1 of 6" in synced.text_detail
    assert synced.advice("backport").endswith("drop the backport")
    assert _prepare(fork.spec(fork.synced) + "+backport").patch_text == "stale"
    listed = repro("targets", fork.spec(fork.synced) + "+backport", check_rc=0).stdout
    assert "stale" in listed and "upstream marker" in listed


def test_a_real_conflict_names_its_hunk_and_is_one_target_line(fork: Fork, tmp_path: Path) -> None:
    moved = tmp_path / "moved"  # upstream rewrote a line our third hunk needs, without fixing the bug
    shutil.copytree(Path(_prepare(fork.spec(fork.upstream_base)).root), moved)
    fuser = moved / FUSER
    fuser.write_text(fuser.read_text().replace("tensor._do_not_clear = True", "setattr(tensor, '_do_not_clear', True)"))
    prepared = _prepare(f"path:{moved}+backport")
    assert prepared.patch_status == "conflict" and prepared.patch_text == "conflict"
    assert prepared.patch_text_detail == (f"hunk 3 of 6 (@@ -190,7 +192,8 @@) fails at {FUSER}:190; the tree no"
                                          " longer has `tensor._do_not_clear = True`")  # was "Checking patch ..."
    result = repro("run", *EXPOSING, "--targets", f"path:{moved}+backport", "--out", str(tmp_path / "run"))
    assert result.returncode == 1
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["results"] == [] and len(run["target_problems"]) == 1  # not a harness_error per case
    assert "hunk 3 of 6" in run["target_problems"][0]["problem"] and "hunk 3 of 6" in result.stderr
    assert run["summary"]["status"] == "FAIL"


# ---- repro review ----

def test_review_of_the_sync_says_drop_the_backport(fork: Fork, tmp_path: Path) -> None:
    out = tmp_path / "review"
    before = git(fork.repo, "status", "--porcelain"), git(fork.repo, "rev-parse", "HEAD")
    result = repro("review", "--base", fork.spec("fork~1"), "--head", fork.spec("fork"), *EXPOSING, "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (git(fork.repo, "status", "--porcelain"), git(fork.repo, "rev-parse", "HEAD")) == before
    text = (out / "review.md").read_text()
    assert text.splitlines()[0] == ("# ✅ PASS — Merge: no regression at head; drop patches/backport.patch:"
                                     " upstream's fix is present")
    found = json.loads((out / "review.json").read_text())
    (issue22,) = found["regressions"]
    assert issue22["base"]["role"] == "patched" and issue22["head"]["role"] == "fixed_upstream"
    assert [(a["patch"], a["action"]) for a in issue22["advice"]] == [("backport", "drop")]
    assert "drop backport: upstream's fix is present at head" in text
    assert [a["text"] for a in issue22["patches"]["head"]] == ["stale"]
    assert found["changes"] == [] and "no regression at head" in text
    assert f"git {fork.fork_base[:12]} (fork~1), clean" in text and f"git {fork.synced[:12]} (fork), clean" in text
    for name in ("report.md", "report.html", "junit.xml", "run.json"):
        assert (out / name).is_file()


def test_review_lists_exactly_the_cases_one_edited_op_changes(tmp_path: Path) -> None:
    """And with `--upstream-tests`, each tree's own tests on it: the test the edit breaks is listed with its
    reason and fails the review; the one it leaves alone is not listed."""
    released = Path(_prepare("te-2.16.0").root)
    base, head = tmp_path / "base", tmp_path / "head"
    for tree in (base, head):
        shutil.copytree(released / "transformer_engine", tree / "transformer_engine")
        (tree / "tests/pytorch").mkdir(parents=True)
        (tree / "tests/pytorch/test_fusible_ops.py").write_text(UPSTREAM_STYLE_TESTS)
    identity = head / "transformer_engine/pytorch/ops/basic/identity.py"
    source = identity.read_text()
    assert source.count("        return input_\n") == 1
    identity.write_text(source.replace("        return input_\n", "        return input_ * 2\n"))
    out = tmp_path / "review"
    result = repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *TWO_PIPELINES, "--upstream-tests",
                   "--out", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    found = json.loads((out / "review.json").read_text())
    run = json.loads((out / "run.json").read_text())
    identity_cases = {r["case_id"] for r in run["results"] if r["pipeline"] == "identity"}
    assert len(identity_cases) == 10 and len(run["results"]) == 40
    assert {c["case_id"] for c in found["changes"]} == identity_cases  # and no rmsnorm case
    assert {c["kind"] for c in found["changes"]} == {"new failure"}
    upstream = found["upstream_tests"]
    assert (upstream["base"], upstream["head"]) == ({"passed": 2, "failed": 0, "skipped": 0},
                                                    {"passed": 1, "failed": 1, "skipped": 0})
    assert [(c["test"], c["base"], c["head"]) for c in upstream["changes"]] == [
        ("TestBasicOps::test_identity", "passed", "failed")]
    assert upstream["changes"][0]["why"].startswith("tolerance: values beyond upstream's tolerance")
    broken = f"TestBasicOps::test_identity: {upstream['changes'][0]['why']}"
    assert any(r.startswith("10 new failures in ") for r in found["fail_reasons"]), found["fail_reasons"]
    assert found["fail_reasons"][-1] == f"1 of upstream's fuser tests fail at head and did not at base (e.g. {broken})"
    review_md = (out / "review.md").read_text()
    assert "## Upstream's fuser tests (tests/pytorch/test_fusible_ops.py), base → head" in review_md
    assert "| `TestBasicOps::test_identity` | passed | failed | tolerance" in review_md


# ---- repro diff ----

def _split(run_dir: Path, spec: str, into: Path) -> Path:
    """One target's part of a stored run, as a run of its own."""
    run = json.loads((run_dir / "run.json").read_text())
    run["environment"]["targets"] = [t for t in run["environment"]["targets"] if t["spec"] == spec]
    run["results"] = [r for r in run["results"] if r["target"] == spec]
    into.mkdir()
    (into / "run.json").write_text(json.dumps(run))
    return into


def test_diff_pairs_differently_named_trees_and_flags_pass_to_fail(fork: Fork, tmp_path: Path) -> None:
    out = tmp_path / "review"
    base, head = fork.spec("fork~1"), fork.spec("lost-fix")
    repro("review", "--base", base, "--head", head, *EXPOSING, "--out", str(out), check_rc=1)
    a, b = _split(out, base, tmp_path / "a"), _split(out, head, tmp_path / "b")
    result = repro("diff", str(a), str(b), "--map", f"{base}={head}", check_rc=1)
    lines = result.stdout.splitlines()
    assert any(base in line and head in line and "--map" in line for line in lines)
    assert "5 results compared, on 1 paired targets" in result.stdout
    regressions = [line for line in lines if line.startswith("new failure")]
    assert len(regressions) == 3 and all(" pass/fixed " in line and "/regression" in line for line in regressions)
    md = repro("diff", str(a), str(b), "--map", f"{base}={head}", "--format", "md", check_rc=1).stdout
    assert md.startswith("## repro diff") and "**3 new failure**" in md
    refused = repro("diff", str(a), str(b), "--map", f"{base}=nope", check_rc=2)
    assert "'nope' is not a target of run B" in refused.stderr


def test_diff_into_a_closed_pipe_ends_quietly() -> None:
    fixture = REPO / "tests" / "fixtures" / "run-small"
    process = subprocess.Popen([sys.executable, "-m", "repro", "diff", str(fixture), str(fixture)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before repro writes a byte (`| head -0`)
    err = process.stderr.read().decode()
    process.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


# ---- reports that fit a pull request ----

def test_reports_of_hundreds_of_failures_fit_a_pull_request() -> None:
    from tests.synthetic import issue22_sized_run

    run = issue22_sized_run(1600)
    fixed = [r for r in run["results"] if r["target"] == "te-2.13.0+backport" and r["verdict"] == "fixed"]
    assert len(fixed) > 336
    for n, record in enumerate(fixed[:400]):  # a fork that lost the fix: many failures, many messages
        record.update(outcome="crash", verdict="regression", verdict_reason="a patched target was expected to pass",
                      error={"type": "RuntimeError", "location": f"transformer_engine/pytorch/ops/fuser.py:{100 + n % 3}",
                             "message": f"failure number {n % 150}: " + "x" * 900, "traceback": "tb " * 500})
    run["summary"] = reports.summarize(run)
    for fmt in ("md", "summary"):
        text = formats.render(run, fmt)
        assert len(text) < PR_LIMIT, (fmt, len(text))  # each case was listed: well over 65,536 characters
        assert text.splitlines()[2].startswith("**❌ FAIL**: ")  # the verdict first, after the title
        assert "## Needs a look (400), 150 signatures" in text and "see report.html" in text


# ---- provenance in every report ----

def test_provenance_and_a_dirty_tree_reach_every_report(tmp_path: Path) -> None:
    from repro.progress import status_line

    tree = tmp_path / "tree"
    shutil.copytree(Path(_prepare("te-2.13.0").root) / "transformer_engine", tree / "transformer_engine")
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "import")
    commit = git(tree, "rev-parse", "HEAD")
    git(tree, "checkout", "-q", "--detach")
    (tree / FUSER).write_text((tree / FUSER).read_text() + "\n# local edit\n")
    prepared = _prepare(f"path:{tree}")
    assert prepared.provenance == {"git_commit": commit, "git_branch": f"detached at {commit[:12]}",
                                   "git_state": "dirty"}  # a detached HEAD read "on HEAD"
    run = json.loads((REPO / "tests/fixtures/run-small/run.json").read_text())
    run["environment"]["targets"][0]["provenance"] = prepared.provenance
    run["environment"]["targets"][0]["role_reasons"] = {"issue22": "a reason to show"}
    said = f"git {commit[:12]} detached at {commit[:12]}, dirty"
    warning = f"WARNING: {run['environment']['targets'][0]['spec']} is a dirty tree"
    md, html, junit = (formats.render(run, fmt) for fmt in ("md", "html", "junit"))
    assert said in md and warning in md and "a reason to show" in md
    assert said in html and warning in html and "a reason to show" in html
    assert f'name="git_commit" value="{commit}"' in junit and 'name="git_state" value="dirty"' in junit
    assert "a reason to show" in junit
    assert said in status_line(run)


@pytest.mark.parametrize("args, message", [
    (["--base", "te-2.13.0+backport", "--head", "te-2.16.0"], "give the tree without +backport"),
    (["--base", "te-2.16.0", "--head", "te-2.16.0"], "--base and --head are both te-2.16.0"),
    (["--base", "path:{repo}@no-such-branch", "--head", "te-2.16.0"], "'no-such-branch' is not a commit"),
])
def test_bad_review_input_is_one_line(fork: Fork, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    result = repro("review", *(a.format(repo=fork.repo) for a in args), "--out", str(out), check_rc=2)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


def test_a_revision_that_predates_the_op_fuser_is_named_by_its_spec(tmp_path: Path) -> None:
    """A fork commit from before te.ops (ROCm's merge of upstream v1.9 has no ops/): one line naming the
    spec and the commit, not the cache's staging folder."""
    repo = tmp_path / "old-fork"
    (repo / "transformer_engine/pytorch").mkdir(parents=True)
    (repo / "transformer_engine/pytorch/__init__.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "before te.ops")
    result = repro("review", "--base", f"path:{repo}@HEAD", "--head", "te-2.16.0", "--out", str(tmp_path / "out"),
                   check_rc=2)
    assert result.stderr.startswith(f"repro: error: path:{repo}@HEAD: commit ") and "predates TE's op fuser" in \
        result.stderr and ".cache" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_junit_has_an_error_testcase_for_each_result_a_finished_run_lacks() -> None:
    import xml.etree.ElementTree as ET

    run = json.loads((REPO / "tests/fixtures/run-small/run.json").read_text())
    spec = run["results"][0]["target"]
    lost = [{"target": spec, "case_id": f"issue22:lost-{n}", "reason": "its session exited with status -9"}
            for n in range(3)]
    run.update(complete=False, missing=3, not_run=lost)
    root = ET.fromstring(formats.render(run, "junit").encode())
    errors = root.findall(".//testcase/error[@type='missing']")
    assert len(errors) == 3 and int(root.get("errors")) == 3  # it said errors=0 while repro exited 1
    assert all("status -9" in e.get("message") for e in errors)
    assert {c.get("name") for c in root.findall(".//testcase") if c.find("error") is not None} == \
        {item["case_id"] for item in lost}


# ---- one verdict per review, the answer first (issue 23) ----

@pytest.fixture(scope="module")
def lost_fix_review(fork: Fork, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A review of the sync that lost the fix, as GitHub Actions would run it."""
    import os

    out = tmp_path_factory.mktemp("lost") / "review"
    summary = out.parent / "step-summary.md"
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    result = subprocess.run([sys.executable, "-m", "repro", "review", "--base", fork.spec("fork~1"), "--head",
                             fork.spec("lost-fix"), *EXPOSING, "--out", str(out)], capture_output=True, text=True,
                            cwd=REPO, env=env, check=False)
    return out, result


def test_a_sync_that_lost_the_fix_fails_in_every_report(lost_fix_review: tuple[Path, Any]) -> None:
    import xml.etree.ElementTree as ET

    out, result = lost_fix_review
    assert result.returncode == 1, result.stdout + result.stderr
    first = (out / "review.md").read_text().splitlines()[0]
    assert first.startswith("# ❌ Do not merge: issue22 is back at head") and \
        first.endswith("re-apply patches/backport.patch: it applies"), first
    assert "Review: ❌ Do not merge: issue22 is back at head" in (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert 'class="status-fail"' in html and 'id="recommendation"' in html and "Do not merge" in html
    verdict = ET.parse(out / "junit.xml").getroot().find(".//testcase[@classname='repro_verdict']")
    assert verdict.get("name") == "review" and verdict.find("failure").get("message").startswith("FAIL: ❌ Do not merge")
    assert "Do not merge: issue22 is back at head" in (out.parent / "step-summary.md").read_text()
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["status"] == "FAIL" and run["review"]["status"] == "FAIL"
    last = result.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("review FAIL: ❌ Do not merge") and len(last) <= 200, last
    assert "::error file=transformer_engine/pytorch/ops/fuser.py,line=" in result.stdout


def test_the_review_shows_what_the_sync_changed_in_ops(lost_fix_review: tuple[Path, Any], fork: Fork) -> None:
    out, _ = lost_fix_review
    text = (out / "review.md").read_text()
    assert "transformer_engine/pytorch/ops/fuser.py |" in text and "guard fuser grad checks on non-leaf nodes" in text
    assert "[NVIDIA/TransformerEngine PR \\#2919](https://github.com/NVIDIA/TransformerEngine/pull/2919)" in text
    assert "[report.html](report.html)" in text and str(out) not in text  # links relative to the run dir
    assert "**head+backport** = " in text and "| issue22 | patched: fixed 3/3 | fixed\\_upstream: bug back 3/3 ⚠ | backport: re-apply |" in text


FRONT_WITH_OWN_RMSNORM = '''"""The fork's Python front of its compiled extension, with its own RMSNorm forward."""
import sys
import types

import transformer_engine_torch_nv

front = types.ModuleType("transformer_engine_torch")
front.__dict__.update({k: v for k, v in vars(transformer_engine_torch_nv).items() if not k.startswith("__")})


def rmsnorm_fwd(*args, **kwargs):
    out, mu, rsigma = transformer_engine_torch_nv.rmsnorm_fwd(*args, **kwargs)
    return out * 1.5, mu, rsigma


front.rmsnorm_fwd = rmsnorm_fwd
sys.modules["transformer_engine_torch"] = front
'''


def test_a_review_across_kernel_providers_says_so(tmp_path: Path, cache: Path) -> None:
    from tests.test_renamed_extension import _renaming_fork

    base = tmp_path / "base"
    shutil.copytree(Path(_prepare("te-2.13.0").root) / "transformer_engine", base / "transformer_engine")
    head = _renaming_fork(tmp_path / "head", cache, build_files=True)
    (head / "transformer_engine/fork_front.py").write_text(FRONT_WITH_OWN_RMSNORM)
    targets_out = repro("targets", f"path:{head}", check_rc=0).stdout
    assert "kernels: the tree's own Python module transformer_engine_torch" in targets_out
    out = tmp_path / "review"
    repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *TWO_PIPELINES, "--out", str(out), check_rc=1)
    found = json.loads((out / "review.json").read_text())
    assert found["kernels"]["base"].startswith("the harness's CPU stand-ins")
    assert found["kernels"]["head"].startswith("the tree's own Python module transformer_engine_torch")
    assert found["rule"] == "kernels_differ" and "computed kernels with different code" in found["headline"]
    assert found["headline"].startswith("❌ Needs a look: ")


def test_a_review_against_a_renamed_op_says_what_stopped_running(tmp_path: Path, cache: Path) -> None:
    from tests.test_verdict_names import NARROW, _renamed_op_tree

    base = tmp_path / "base"
    shutil.copytree(Path(_prepare("te-2.13.0").root) / "transformer_engine", base / "transformer_engine")
    head = _renamed_op_tree(tmp_path / "head", cache)
    out = tmp_path / "review"
    result = repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *NARROW, "--out", str(out),
                   check_rc=1)
    found = json.loads((out / "review.json").read_text())
    stopped = [g for g in found["groups"] if g["change"] == "stopped running"]
    assert stopped and all(g["signature"].endswith(("→ not run", "→ not_judged")) for g in stopped)
    assert any("cases no longer run" in r for r in found["fail_reasons"]), found["fail_reasons"]
    assert not any(g["change"] == "fixed" for g in found["groups"])  # lost cases are never "fixed"
    assert "stopped running" in (out / "review.md").read_text() and "review FAIL" in result.stdout
    accepted = repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *NARROW, "--out",
                     str(tmp_path / "accepted"), "--accept-lost-coverage", check_rc=1)  # not_judged still fails
    again = json.loads((tmp_path / "accepted" / "review.json").read_text())
    assert not any("no longer run" in r for r in again["fail_reasons"]) and "not_judged" in accepted.stdout + \
        " ".join(again["fail_reasons"])


def test_a_refusal_that_is_the_fix_counts_as_fixed_in_the_review() -> None:
    from repro.review import target_state

    refused = [{"target": "t", "regression": "extra_state_pickle", "case_id": f"extra_state_pickle:c{n}",
                "outcome": "crash", "verdict": "fixed", "expected": "affected", "symptom": False} for n in range(2)]
    run = {"environment": {"targets": [{"spec": "t", "roles": {"extra_state_pickle": "patched"}}]},
           "results": refused}
    assert target_state(run, "t", "extra_state_pickle")["said"] == "fixed on 2 of 2 affected cases"



def test_review_with_upstream_tests_needs_checkouts(tmp_path: Path) -> None:
    result = repro("review", "--base", "te-2.13.0", "--head", "te-2.16.0", "--upstream-tests", "--out",
                   str(tmp_path / "review"), check_rc=2)
    assert result.stderr.strip().splitlines() == [
        "repro: error: te-2.13.0 is not a checkout (the wheel ships no tests); give path:DIR or path:DIR@REV"], \
        result.stderr
    assert not (tmp_path / "review").exists()


# A fork's dispatcher as TE-FL has it: a module object of a class of its own (no __file__) under
# transformer_engine_torch, dispatching to the compiled module, and failing one kernel in its own manager.
FORK_MANAGER = '''def call(name, impl, *args, **kwargs):
    if impl is None:
        raise RuntimeError(f"All 1 implementation(s) failed for op='{name}'. Last error: {name} - not implemented")
    return impl(*args, **kwargs)
'''
FORK_DISPATCHER = '''import inspect
import sys
import types

import transformer_engine_torch_nv as native
from transformer_engine.plugin.core import manager


class ForkModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        impl = None if name == "rmsnorm_bwd" else getattr(native, name)
        if impl is not None and not (inspect.isfunction(impl) or inspect.isbuiltin(impl)):
            return impl
        return lambda *args, **kwargs: manager.call(name, impl, *args, **kwargs)


sys.modules["transformer_engine_torch"] = ForkModule("transformer_engine_torch")
'''


def test_failures_in_a_forks_own_kernels_are_its_own(tmp_path: Path, cache: Path) -> None:
    """Failures raised in the fork's kernel module are grouped under it, never the sync's or the backport's:
    the review asks for a look at what went unjudged, names the module, and counts none as a junit failure."""
    import xml.etree.ElementTree as ET

    from tests.test_renamed_extension import _renaming_fork

    base = tmp_path / "base"
    shutil.copytree(Path(_prepare("te-2.13.0").root) / "transformer_engine", base / "transformer_engine")
    head = _renaming_fork(tmp_path / "head", cache, build_files=True)
    core = head / "transformer_engine/plugin/core"
    core.mkdir(parents=True)
    for path, text in ((head / "transformer_engine/plugin/__init__.py", ""), (core / "__init__.py", ""),
                       (core / "manager.py", FORK_MANAGER), (core / "_module_setup.py", FORK_DISPATCHER),
                       (head / "transformer_engine/fork_front.py", "import transformer_engine.plugin.core._module_setup\n")):
        path.write_text(text)
    out = tmp_path / "review"
    result = repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *TWO_PIPELINES, "--out", str(out),
                   check_rc=1)
    found = json.loads((out / "review.json").read_text())
    assert found["rule"] == "kernels_failed", found["fail_reasons"]
    assert found["headline"].startswith("❌ Needs a look: ") and "head's own kernels (plugin/core/)" in found["headline"]
    assert "(transformer_engine/plugin/core/_module_setup.py)" in found["kernels"]["head"]
    mine = [g for g in found["groups"] if g["provider"]]
    assert mine and all("op='rmsnorm_bwd'" in g["signature"] for g in mine)
    assert not found["failing"]  # none is the sync's
    issue22 = found["regressions"][0]
    assert "failed in the fork's own kernels, not counted" in issue22["head"]["said"]
    text = (out / "review.md").read_text()
    assert "## Kernels not the harness's" in text and str(tmp_path) not in text
    root = ET.parse(out / "junit.xml").getroot()
    failed = [c for c in root.iter("testcase") if c.find("failure") is not None]
    assert [c.get("classname") for c in failed] == ["repro_verdict"]
    assert "review FAIL: ❌ Needs a look" in result.stdout


# ---- the review's decision on real trees (harness/runner/decision.py) ----

def _te_tree(root: Path, edit: Any = None) -> Path:
    """te-2.13.0's package as a source tree, its fuser.py passed through `edit`."""
    shutil.copytree(Path(_prepare("te-2.13.0").root) / "transformer_engine", root / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        fuser = root / FUSER
        fuser.write_text(edit(fuser.read_text()))
    return root


def _fails_to_import(text: str) -> str:
    assert text.count("\nimport torch\n") == 1
    return text.replace("\nimport torch\n", "\nimport torch\nimport transformer_engine.no_such_module\n")


def _review(tmp_path: Path, base: Path, head: Path) -> tuple[dict[str, Any], Path, subprocess.CompletedProcess]:
    out = tmp_path / "review"
    result = repro("review", "--base", f"path:{base}", "--head", f"path:{head}", *EXPOSING, "--out", str(out))
    return json.loads((out / "review.json").read_text()), out, result


def _says_everywhere(found: dict[str, Any], out: Path, result: subprocess.CompletedProcess) -> None:
    """The decision's first line in review.md, report.md, report.html, junit and the terminal; its exit status."""
    import html
    import xml.etree.ElementTree as ET

    from repro.render_md import plain

    assert result.returncode == found["exit_code"], result.stdout + result.stderr
    assert (out / "review.md").read_text().splitlines()[0] == f"# {plain(found['headline'])}"
    assert plain(found["headline"]) in (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    assert html.escape(found["headline"], quote=False) in page and f'status-{found["status"].lower()}' in page
    verdict = ET.parse(out / "junit.xml").getroot().find(".//testcase[@classname='repro_verdict']")
    assert found["headline"] in verdict.find("failure").get("message")
    assert result.stdout.rstrip("\n").splitlines()[-1].startswith(f"review {found['status']}: {found['headline'][:60]}")


def test_a_head_that_does_not_load_is_do_not_merge(tmp_path: Path) -> None:
    base, head = _te_tree(tmp_path / "base"), _te_tree(tmp_path / "head", _fails_to_import)
    found, out, result = _review(tmp_path, base, head)
    assert found["rule"] == "head_does_not_load" and found["headline"].startswith(
        "❌ Do not merge: head does not load: ops/fuser.py:"), found["headline"]
    assert "imports module transformer_engine.no_such_module" in found["fail_reasons"][0]
    _says_everywhere(found, out, result)


def test_two_trees_that_load_nothing_cannot_be_judged(tmp_path: Path) -> None:
    """Was "✅ PASS — Merge" with nothing judged (both sides' harness errors matched case for case)."""
    base, head = _te_tree(tmp_path / "base", _fails_to_import), _te_tree(tmp_path / "head", _fails_to_import)
    found, out, result = _review(tmp_path, base, head)
    assert found["rule"] == "nothing_judged" and found["status"] == "FAIL", found["headline"]
    assert found["headline"].startswith("⚠ Cannot judge: neither tree loads: ops/fuser.py:")
    assert found["standing"] == "" and "standing:" not in (tmp_path / "review" / "review.md").read_text()
    _says_everywhere(found, out, result)


def test_a_backport_that_conflicts_while_the_bug_is_upstream_is_do_not_merge(tmp_path: Path) -> None:
    """A head that rewrites the line the backport changes, the bug kept (as a TE developer's branch that
    reworks the fuser's forward did): the review said PASS, the conflict 80 characters into its first line."""
    def reworded(text: str) -> str:
        old = "y.requires_grad_(idx >= fuser.first_op_requiring_backward)"
        assert text.count(old) == 1
        return text.replace(old, "y.requires_grad_(fuser.first_op_requiring_backward <= idx)")

    base, head = _te_tree(tmp_path / "base"), _te_tree(tmp_path / "head", reworded)
    found, out, result = _review(tmp_path, base, head)
    assert found["headline"] == ("❌ Do not merge: patches/backport.patch no longer applies (ops/fuser.py:138) and"
                                 " issue22 is still upstream: port it"), found["headline"]
    (issue22,) = found["regressions"]
    assert issue22["head"]["state"] == "reproduces" and [a["action"] for a in issue22["advice"]] == ["port"]
    _says_everywhere(found, out, result)
    text = (out / "review.md").read_text()
    assert str(tmp_path) not in text and not re.search(r"\b[0-9a-f]{40}\b", text)  # fits a pull request


@pytest.mark.parametrize("release", ["te-2.9.0", "te-2.13.0", "te-2.16.0"])
def test_the_saved_tensors_fix_is_recognised_in_its_later_forms(release: str) -> None:
    """2.8 on restores the saved tensors once through restore_from_saved, 2.16 on through restore_from_func_ctx:
    the marker knew only 2.5's `saved_tensors = func_ctx.saved_tensors`, so a synced fork read 'fix not found'."""
    found = patching.assess(Path(_prepare(release).root), patching.load_patch("saved_tensors_once"))
    assert found.fix == patching.FIX_UPSTREAM, found


def test_a_regression_row_says_what_was_judged_when_nothing_was_predicted_affected() -> None:
    """The generated matrix predicts no case affected: its row counts what was judged, and says
    "none judged" only where nothing was (two te-2.16.1 -> te-2.17.0 reviews read 'none judged'
    beside 348 standing failures of that matrix)."""
    from repro.review import state_cell
    state = {"role": "unknown", "cases": 40, "judged": 0, "affected": 0}
    assert state_cell(state) == "unknown: none judged"
    assert state_cell({**state, "judged": 38}) == "unknown: 38 judged, none affected"
    assert state_cell({**state, "cases": 0}) == "not run"
