"""`repro bisect`: the search over a commit list with a fake judge (fast), and the command on a
repository built here with git from the cached release trees (tests/forks.py's way): a chain
from te-2.13.0 to te-2.16.0's fix with a commit that does not load, then a commit that loses
the fix again. Never a fetched upstream."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness import targets
from harness.runner import bisect
from harness.runner.bisect import NoAnswer
from harness.targets import history, sources
from repro import reports
from tests.conftest import repro
from tests.forks import FUSER, QUANTIZED_TENSOR, git

CASE = "issue22:ops-extra_output_only-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
BUG = {"outcome": "crash", "verdict": "reproduced", "failed_checks": ["completion"],
       "error": {"type": "RuntimeError", "location": "transformer_engine/pytorch/ops/fuser.py:141"}}
PASS = {"outcome": "pass", "verdict": "fixed", "failed_checks": [], "error": None}


def _judged(*records: dict[str, Any], case: str = "c") -> bisect.Judged:
    return bisect.signatures([{"case_id": f"{case}{i}", **r} for i, r in enumerate(records)])


class FakeHistory:
    """Commits 0..N (0 the good end); `states[i]` the records at commit i, None: does not load."""

    def __init__(self, states: list[list[dict[str, Any]] | None]) -> None:
        self.states, self.asked = states, []

    @property
    def commits(self) -> list[str]:
        return [f"c{i}" for i in range(1, len(self.states))]

    def judge(self, commit: str) -> bisect.Judged | None:
        self.asked.append(commit)
        records = self.states[int(commit[1:])]
        return None if records is None else _judged(*records)


# ---- the search, with a fake judge ----

def test_names_the_first_changed_commit_in_about_log2_steps() -> None:
    fake = FakeHistory([[BUG]] * 40 + [[PASS]] * 25)
    answer = bisect.bisect("c0", fake.commits, fake.judge)
    assert answer.culprits == ["c40"] and answer.exact and answer.last_good == "c39"
    assert len(fake.asked) <= 2 + 7  # the two ends, then log2(64)+1
    assert bisect.describe(answer.before) == [
        "1 case: crash RuntimeError at transformer_engine/pytorch/ops/fuser.py [completion]"]
    assert bisect.describe(answer.after) == ["1 case: pass"]


def test_a_broken_case_is_found_as_a_fixed_one() -> None:
    fake = FakeHistory([[PASS, PASS]] * 6 + [[PASS, BUG]] * 3)
    answer = bisect.bisect("c0", fake.commits, fake.judge)
    assert answer.culprits == ["c6"] and bisect.changed_cases(answer.before, answer.after) == ["c1"]


def test_commits_that_cannot_be_judged_are_skipped() -> None:
    not_applicable = {**PASS, "outcome": "not_applicable", "verdict": "not_applicable"}
    load_error = {**PASS, "outcome": "harness_error", "verdict": "harness_error"}
    # Skipped commits away from the change: still one commit named.
    fake = FakeHistory([[BUG]] * 3 + [None, [load_error]] + [[BUG]] * 3 + [[PASS]] * 4)
    answer = bisect.bisect("c0", fake.commits, fake.judge)
    assert answer.culprits == ["c8"]
    # Right before the change: one of these K commits, the skipped ones first.
    fake = FakeHistory([[BUG]] * 5 + [None, [not_applicable], None] + [[PASS]] * 3)
    answer = bisect.bisect("c0", fake.commits, fake.judge)
    assert answer.culprits == ["c5", "c6", "c7", "c8"] and not answer.exact
    assert {s.commit for s in answer.steps if s.state == "skipped"} <= {"c5", "c6", "c7"}
    assert all(s.why for s in answer.steps if s.state == "skipped")


def test_compares_signatures_not_outcomes() -> None:
    """The same outcome (crash) with another error type or file is a change: the commit that
    moved the failure is named (a bisect comparing outcomes finds both ends alike)."""
    moved = {**BUG, "error": {"type": "TypeError", "location": "transformer_engine/pytorch/ops/basic/rmsnorm.py:9"}}
    fake = FakeHistory([[BUG]] * 4 + [[moved]] * 4)
    assert bisect.bisect("c0", fake.commits, fake.judge).culprits == ["c4"]
    other_checks = {**PASS, "outcome": "wrong_output", "failed_checks": ["outputs"]}
    grads = {**other_checks, "failed_checks": ["outputs", "grads"]}
    fake = FakeHistory([[other_checks]] * 2 + [[grads]] * 5)
    assert bisect.bisect("c0", fake.commits, fake.judge).culprits == ["c2"]


def test_ignores_verdicts_roles_and_line_numbers() -> None:
    """A commit between releases reads the next .dev0 (role unknown): the same failure gets
    another verdict there; and commits that edit fuser.py move its line. Neither is a change."""
    between = {**BUG, "verdict": "other_failure", "error": {**BUG["error"], "location": BUG["error"]["location"]
                                                            .replace(":141", ":150")}}
    fake = FakeHistory([[BUG]] + [[between]] * 5 + [[PASS]])
    assert bisect.bisect("c0", fake.commits, fake.judge).culprits == ["c6"]


def test_no_answer_when_the_ends_agree_or_cannot_be_judged() -> None:
    fake = FakeHistory([[BUG]] * 4)
    with pytest.raises(NoAnswer, match="same state at both ends"):
        bisect.bisect("c0", fake.commits, fake.judge)
    fake = FakeHistory([None, [BUG], [PASS]])
    with pytest.raises(NoAnswer, match="the good end .* cannot be judged"):
        bisect.bisect("c0", fake.commits, fake.judge)


def test_cases_not_judged_at_an_end_are_left_out() -> None:
    not_applicable = {**PASS, "outcome": "not_applicable", "verdict": "not_applicable"}
    fake = FakeHistory([[BUG, not_applicable]] * 3 + [[PASS, PASS]] * 2)
    answer = bisect.bisect("c0", fake.commits, fake.judge)
    assert answer.culprits == ["c3"] and answer.cases == ["c0"] and answer.dropped == ["c1"]


def test_a_merge_base_unlike_the_good_end_is_no_answer() -> None:
    fake = FakeHistory([[BUG], [BUG], [PASS], [PASS]])
    answer = bisect.bisect("c0", ["c2", "c3"], fake.judge, base="c1")  # c1: the merge base, as good
    assert answer.culprits == ["c2"] and answer.steps[2].role == "merge base"
    with pytest.raises(NoAnswer, match="merge base c2"):
        bisect.bisect("c0", ["c3"], fake.judge, base="c2")


def test_subjects_name_their_pull_request() -> None:
    assert history.pr_number("guard fuser grad checks on non-leaf nodes (#2919)") == 2919
    assert history.pr_number("Merge pull request #12 from a/b") == 12
    assert history.pr_number("fix (#12) in the middle") is None


# ---- the command, on a repository built from the cached release trees ----

def _write(repo: Path, relpath: Path | str, text: str) -> None:
    (repo / relpath).write_text(text)


def _commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def _te_repo(repo: Path, branch: str, version: str) -> tuple[Path, Path, Path]:
    """A git repository on `branch` holding te-2.13.0's package at `version` (uncommitted), and the roots of
    te-2.13.0 and te-2.16.0."""
    cache = sources.cache_dir()
    old = Path(targets.prepare("te-2.13.0", cache).root)
    new = Path(targets.prepare("te-2.16.0", cache).root)
    repo.mkdir()
    git(repo, "init", "-q", "-b", branch)
    shutil.copytree(old / "transformer_engine", repo / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "build_tools").mkdir()
    _write(repo, "build_tools/VERSION.txt", f"{version}\n")
    return repo, old, new


def _copy_fuser(repo: Path, release: Path, message: str) -> str:
    """Commit `release`'s fuser.py (and the quantized_tensor.py it imports from) into the repository."""
    for relpath in (FUSER, QUANTIZED_TENSOR):
        shutil.copy(release / relpath, repo / relpath)
    return _commit(repo, message)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    repo, old, new = _te_repo(tmp_path_factory.mktemp("bisect") / "te", "main", "2.13.0")
    c = {"release": _commit(repo, "release 2.13.0")}
    git(repo, "tag", "v2.13")  # upstream tags a release vX.Y
    _write(repo, "build_tools/VERSION.txt", "2.16.0.dev0\n")  # its role is unknown from here on: verdicts change
    c["dev"] = _commit(repo, "bump the version to 2.16.0.dev0")
    ops_init = repo / "transformer_engine/pytorch/ops/__init__.py"
    before = ops_init.read_text()
    _write(repo, ops_init.relative_to(repo), before + "\nfrom .not_written_yet import Everything  # noqa\n")
    c["no_load"] = _commit(repo, "start a refactor (does not import)")
    _write(repo, ops_init.relative_to(repo), before)
    c["loads"] = _commit(repo, "finish the refactor")
    c["fix"] = _copy_fuser(repo, new, "guard fuser grad checks on non-leaf nodes (#2919)")
    _write(repo, "NOTES.md", "notes\n")
    c["fixed"] = _commit(repo, "notes")
    c["lost"] = _copy_fuser(repo, old, "simplify the fuser (#3001)")
    _write(repo, "NOTES.md", "more notes\n")
    c["head"] = _commit(repo, "more notes")
    # A refactor that moves the failing call into a helper module: the case still crashes with
    # the same RuntimeError (the outcome is unchanged), now from another file.
    fuser = repo / FUSER
    call = "y.requires_grad_(idx >= fuser.first_op_requiring_backward)"
    assert call in fuser.read_text()
    _write(repo, FUSER, fuser.read_text().replace(call, "_set_requires_grad(y, idx >= fuser.first_op_requiring_backward)")
           .replace("\nimport torch\n", "\nimport torch\n\nfrom ._grad import set_requires_grad as _set_requires_grad\n", 1))
    _write(repo, FUSER.parent / "_grad.py", "def set_requires_grad(tensor, flag):\n    tensor.requires_grad_(flag)\n")
    c["moved"] = _commit(repo, "set requires_grad through a helper (#3002)")
    _write(repo, "NOTES.md", "even more notes\n")
    c["tip"] = _commit(repo, "even more notes")
    # A user's work in progress, which the bisect must leave as it is.
    _write(repo, "NOTES.md", "uncommitted\n")
    _write(repo, "scratch.txt", "untracked\n")
    git(repo, "stash", "-q")
    _write(repo, "NOTES.md", "uncommitted again\n")
    return repo, c


def _repo_state(repo: Path) -> tuple[str, ...]:
    return (git(repo, "status", "--porcelain", "--untracked-files=all"), git(repo, "stash", "list"),
            git(repo, "rev-parse", "HEAD"), git(repo, "symbolic-ref", "HEAD"), (repo / "NOTES.md").read_text())


def test_bisect_names_the_fix_and_the_break_and_never_changes_the_repository(
        chain: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    repo, c = chain
    untouched = _repo_state(repo)
    out = tmp_path / "fix"
    result = repro("bisect", "--good", f"path:{repo}@{c['release']}", "--bad", f"path:{repo}@{c['fixed']}",
                   "--case", CASE, "--out", str(out), "--github", "NVIDIA/TransformerEngine")
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads((out / "bisect.json").read_text())
    assert answer["commit"]["pr_link"] == "https://github.com/NVIDIA/TransformerEngine/pull/2919"
    assert "[#2919](https://github.com/NVIDIA/TransformerEngine/pull/2919)" in (out / "bisect.md").read_text()
    assert answer["status"] == "found" and answer["commit"]["commit"] == c["fix"], result.stdout
    assert answer["commit"]["pr"] == 2919 and sorted(answer["commit"]["files"]) == sorted(
        [str(FUSER), str(QUANTIZED_TENSOR)])
    assert answer["before"] == ["1 case: crash RuntimeError at transformer_engine/pytorch/ops/fuser.py [completion]"]
    assert answer["after"] == ["1 case: pass"] and answer["last_good"] == c["loads"]
    skipped = [s for s in answer["steps"] if s["state"] == "skipped"]
    assert [s["commit"] for s in skipped] == [c["no_load"]]
    assert c["fix"] in result.stdout and "#2919" in result.stdout and "repro run --case" in result.stdout
    assert f"--targets 'path:{repo}@{c['loads'][:12]}'" in result.stdout or \
        f"--targets path:{repo}@{c['loads'][:12]}" in result.stdout
    step = next(s for s in answer["steps"] if s["commit"] == c["dev"]) if any(
        s["commit"] == c["dev"] for s in answer["steps"]) else answer["steps"][0]
    run = reports.load_run(Path(step["run_dir"]))  # each step is an ordinary run dir
    assert run["results"] and run["environment"]["targets"][0]["provenance"]["git_commit"] == step["commit"]

    assert _repo_state(repo) == untouched


def test_review_bisect_names_the_commit_that_broke_a_case(chain: tuple[Path, dict[str, str]], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`repro review --bisect`'s part: a review run whose head fails a case its base passed
    (base and head revisions of one repository) bisects it and names the commit."""
    from repro import review_bisect

    repo, c = chain
    untouched = _repo_state(repo)
    base, head = f"path:{repo}@{c['fixed']}", f"path:{repo}@{c['head']}"
    run = {"results": [{"case_id": CASE, "target": base, **PASS}, {"case_id": CASE, "target": head, **BUG}]}
    args = argparse.Namespace(base=base, head=head, bisect=True, cache_dir=None, offline=False)
    (found,) = review_bisect.offers_for(run, args, tmp_path)
    assert found["command"] == f"repro bisect --good {base} --bad {head} --case {CASE}"
    answer = found["answer"]
    assert answer["status"] == "found" and answer["commit"]["commit"] == c["lost"] and answer["judged"] == 3
    assert answer["commit"]["pr"] == 3001 and (tmp_path / "bisect-1" / "bisect.json").is_file()
    text = review_bisect.render_offers([found])
    assert f"first changed at `{c['lost'][:12]}` simplify the fuser (\\#3001)\n" in text
    assert c["lost"][:12] in capsys.readouterr().err  # the bisect's own answer went to stderr, not review.md's stdout
    assert _repo_state(repo) == untouched


def test_bisect_compares_signatures_on_a_real_tree(chain: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """The same outcome at both ends (a crash), another signature: a bisect comparing
    outcomes finds nothing to bisect."""
    repo, c = chain
    untouched = _repo_state(repo)
    result = repro("bisect", "--good", f"path:{repo}@{c['head']}", "--bad", f"path:{repo}@{c['moved']}",
                   "--case", CASE, "--out", str(tmp_path / "moved"), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    assert answer["commit"]["commit"] == c["moved"] and answer["after"] == [
        "1 case: crash RuntimeError at transformer_engine/pytorch/ops/_grad.py [completion]"]
    assert _repo_state(repo) == untouched


def test_bad_input_is_one_line_and_status_2(chain: tuple[Path, dict[str, str]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from repro.cli import main

    repo, c = chain
    for args, said in [
        (["--good", f"path:{repo}@{c['release']}", "--bad", f"path:{repo}@{c['release']}", "--case", CASE],
         "are both commit"),
        (["--good", f"path:{repo}@{c['release']}", "--bad", f"path:{repo}@nope", "--case", CASE], "is not a commit"),
        (["--good", "te-2.13.0", "--bad", "te-2.16.0", "--case", CASE], "needs --repo"),
        (["--good", "te-2.13.0", "--bad", "te-2.16.0", "--repo", str(repo), "--case", CASE], "has no tag v2.16.0"),
        (["--good", f"path:{repo}", "--bad", f"path:{repo}@{c['head']}", "--case", CASE], "give a git revision"),
        (["--good", f"path:{repo}@{c['release']}", "--bad", f"path:{repo}@{c['head']}"], "give the cases"),
    ]:
        assert main(["bisect", *args]) == 2  # in this process: each case is refused before any run
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_review_offers_a_bisect_per_changed_signature(chain: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    from repro import review_bisect

    repo, c = chain
    base, head = f"path:{repo}@{c['release']}", f"path:{repo}@{c['fixed']}"
    moved = {**BUG, "error": {"type": "TypeError", "location": "transformer_engine/pytorch/ops/op.py:3"}}
    results = [{"case_id": f"issue22:x-{i}", "target": spec, **record}
               for spec, records in ((base, [BUG, BUG, BUG, PASS]), (head, [PASS, PASS, moved, PASS]))
               for i, record in enumerate(records)]
    results.append({"case_id": "issue22:x-0", "target": f"{head}+backport", **BUG})  # a patched head: not offered
    found = review_bisect.offers({"results": results}, base, head)
    assert [(o["cases"], o["after"]) for o in found] == [
        (2, "pass"), (1, "crash TypeError at transformer_engine/pytorch/ops/op.py [completion]")]
    assert found[0]["argv"] == ["--good", base, "--bad", head, "--case", "issue22:x-0", "--case", "issue22:x-1"]
    text = review_bisect.render_offers(found)
    assert f"repro bisect --good {base}" in text or f"repro bisect --good '{base}'" in text
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    assert review_bisect.offers({"results": results}, base, f"path:{other}@HEAD") == []  # two repositories
    assert review_bisect.offers({"results": results}, base, "te-2.16.0") == []


def test_history_reads_the_range_and_the_release_tags(chain: tuple[Path, dict[str, str]]) -> None:
    repo, c = chain
    order = ["dev", "no_load", "loads", "fix", "fixed", "lost", "head", "moved", "tip"]
    for first_parent in (False, True):
        assert history.commits_between(repo, c["release"], c["tip"], first_parent) == [c[k] for k in order]
    assert history.tag_for_version(repo, "2.13.0") == "v2.13"
    assert history.is_ancestor(repo, c["release"], c["tip"]) and not history.is_ancestor(repo, c["tip"], c["dev"])
    info = history.commit_info(repo, c["moved"])
    assert info.parent == c["head"] and info.pr == 3002 and info.pr_link is None
    assert info.files == [str(FUSER.parent / "_grad.py"), str(FUSER)]


# ---- a fork that syncs by merging an upstream tag ----

@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Upstream: te-2.13.0's tree tagged v2.15, a docs commit, the fix (#2919), release notes
    tagged v2.16. The fork: v2.15 plus a commit of its own (the base), the merge of v2.16, a
    follow-up (the head), then a branch started from the head and merged back."""
    repo, _, new = _te_repo(tmp_path_factory.mktemp("bisect-merge") / "fork", "upstream", "2.16.0.dev0")
    c = {"u0": _commit(repo, "upstream before #2919")}
    git(repo, "tag", "v2.15")
    _write(repo, "NOTES.md", "docs\n")
    c["docs"] = _commit(repo, "docs (#2900)")
    c["fix"] = _copy_fuser(repo, new, "guard fuser grad checks on non-leaf nodes (#2919)")
    _write(repo, "NOTES.md", "release notes\n")
    c["tag"] = _commit(repo, "release notes for 2.16")
    git(repo, "tag", "v2.16")
    git(repo, "checkout", "-q", "-b", "fork", c["u0"])
    _write(repo, "FORK.md", "our fork\n")
    c["base"] = _commit(repo, "fork: our notes")
    git(repo, "merge", "-q", "--no-ff", "--no-edit", "-m", "Merge tag 'v2.16' into fork", "v2.16")
    c["merge"] = git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", "HEAD^2") == c["tag"]
    _write(repo, "FORK.md", "our fork, synced\n")
    c["head"] = _commit(repo, "fork: after the sync")
    git(repo, "checkout", "-q", "-b", "feature")
    _write(repo, "FEATURE.md", "a feature\n")
    c["feature"] = _commit(repo, "fork: a feature")
    git(repo, "checkout", "-q", "fork")
    git(repo, "merge", "-q", "--no-ff", "--no-edit", "-m", "Merge branch 'feature'", "feature")
    c["pr_merge"] = git(repo, "rev-parse", "HEAD")
    return repo, c


def _review_run(base: str, head: str) -> dict[str, Any]:
    return {"results": [{"case_id": CASE, "target": base, **BUG}, {"case_id": CASE, "target": head, **PASS}]}


def test_review_offers_both_sides_of_a_merged_upstream_tag(synced: tuple[Path, dict[str, str]]) -> None:
    """A head that merged an upstream tag: the upstream side first (merge base -> the merged tag,
    where the fix is), then the fork side along its first-parent line. The plain base..head
    bisect never reaches the upstream commits (they are not descendants of the base)."""
    from repro import review_bisect

    repo, c = synced
    assert c["fix"] not in history.commits_between(repo, c["base"], c["head"])  # why one bisect cannot answer
    base = f"path:{repo}@{c['base']}"
    upstream = ["--good", f"path:{repo}@v2.15", "--bad", f"path:{repo}@v2.16", "--case", CASE]
    for head_commit in ("merge", "head", "pr_merge"):  # the merge itself, a follow-up, a later merge of a branch
        head = f"path:{repo}@{c[head_commit]}"
        found = review_bisect.offers(_review_run(base, head), base, head)
        assert [(o["side"], o["argv"]) for o in found] == [
            ("upstream", upstream), ("fork", ["--good", base, "--bad", head, "--first-parent", "--case", CASE])]
        assert found[0]["command"] == "repro bisect " + " ".join(upstream)
        assert f"merge {c['merge'][:12]} (Merge tag 'v2.16' into fork)" in found[0]["what"]
        assert "v2.15..v2.16, 3 commits the base lacks" in found[0]["what"]
    text = review_bisect.render_offers(found)
    assert text.count("1 case: `crash") == 1 and "\n  - upstream side (what merge" in text
    assert "\n  - fork side (the fork's first-parent line" in text
    # Synced already at base, or a branch started from the base: one plain offer, as before.
    for base_commit, head_commit in (("merge", "pr_merge"), ("head", "pr_merge")):
        base, head = f"path:{repo}@{c[base_commit]}", f"path:{repo}@{c[head_commit]}"
        (found_plain,) = review_bisect.offers(_review_run(base, head), base, head)
        assert found_plain["side"] == "" and found_plain["argv"] == ["--good", base, "--bad", head, "--case", CASE]
    # No tag at the ends: 12-hex ids.
    git(repo, "tag", "-d", "v2.15")
    try:
        base, head = f"path:{repo}@{c['base']}", f"path:{repo}@{c['head']}"
        found = review_bisect.offers(_review_run(base, head), base, head)
        assert found[0]["argv"][:4] == ["--good", f"path:{repo}@{c['u0'][:12]}", "--bad", f"path:{repo}@v2.16"]
    finally:
        git(repo, "tag", "v2.15", c["u0"])


def test_review_bisect_runs_the_upstream_side_first_and_names_the_fix(
        synced: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """`repro review --bisect` on a sync: the first bisect it runs is the upstream side, and it
    names upstream's fix; the fork side names the merge."""
    from repro import review_bisect

    repo, c = synced
    base, head = f"path:{repo}@{c['base']}", f"path:{repo}@{c['head']}"
    args = argparse.Namespace(base=base, head=head, bisect=True, cache_dir=None, offline=False)
    upstream, fork = review_bisect.offers_for(_review_run(base, head), args, tmp_path)
    assert upstream["side"] == "upstream" and upstream["answer"]["out"] == str(tmp_path / "bisect-1")
    assert upstream["answer"]["status"] == "found" and upstream["answer"]["commit"]["commit"] == c["fix"]
    assert upstream["answer"]["commit"]["pr"] == 2919
    assert fork["side"] == "fork" and fork["answer"]["commit"]["commit"] == c["merge"]
    text = review_bisect.render_offers([upstream, fork])
    assert f"\n    - first changed at `{c['fix'][:12]}` guard fuser grad checks on non-leaf nodes (\\#2919)\n" in text
    assert f"\n    - first changed at `{c['merge'][:12]}` Merge tag" in text
