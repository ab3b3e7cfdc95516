"""Git never runs the repository's own commands. A repository built here whose config names a
smudge and a clean filter, an fsmonitor, hooks, a textconv and an external diff, each of which
leaves a mark when it runs, and whose attributes ask `git archive` to rewrite a file: exporting
a revision, reading provenance, checking a patch against the work tree and reading the history
leave no mark, export the commit's exact blobs, and leave the repository as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from harness import targets
from harness.errors import UsageError
from harness.targets import history, patching, revisions, safegit, sources
from tests.forks import FUSER, git

MARK = "touch {marks}/{name} && cat"


def _script(path: Path, marks: Path, name: str) -> str:
    path.write_text(f"#!/bin/sh\ntouch {marks}/{name}\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _hostile_repo(root: Path, cache: Path) -> tuple[Path, Path]:
    tree = Path(targets.prepare("te-2.13.0", cache).root)
    repo, marks, hooks = root / "fork", root / "marks", root / "hooks"
    for folder in (repo, marks, hooks):
        folder.mkdir()
    shutil.copytree(tree / "transformer_engine", repo / "transformer_engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "build_tools").mkdir()
    (repo / "build_tools/VERSION.txt").write_text("2.13.0\n")
    with (repo / FUSER).open("a") as fuser:
        fuser.write("# exported at $Format:%H$\n")  # export-subst would rewrite this line
    (repo / ".gitattributes").write_text(f"*.py filter=evil diff=evil ident\n{FUSER} export-subst\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "upstream")
    with (repo / FUSER).open("a") as fuser:
        fuser.write("# the fork's change\n")
    git(repo, "commit", "-q", "-am", "a fork (#7)")
    # The commands, configured after the commit so that building the repository runs none.
    for key, value in {
        "filter.evil.smudge": MARK.format(marks=marks, name="smudge"),
        "filter.evil.clean": MARK.format(marks=marks, name="clean"),
        "filter.evil.required": "true",
        "diff.evil.textconv": _script(root / "textconv", marks, "textconv"),
        "diff.external": _script(root / "external-diff", marks, "external-diff"),
        "core.fsmonitor": _script(root / "fsmonitor", marks, "fsmonitor"),
        "core.hooksPath": str(hooks),
    }.items():
        git(repo, "config", key, value)
    for hook in ("post-index-change", "post-checkout", "pre-auto-gc", "reference-transaction"):
        _script(hooks / hook, marks, f"hook-{hook}")
    # Make the work tree racy: git would re-read (and clean-filter) these files to compare them.
    for relative in (FUSER, Path("transformer_engine/pytorch/ops/basic/basic_linear.py")):
        os.utime(repo / relative, (1, 1))
    return repo, marks


def _state(repo: Path) -> dict[str, str]:
    git_dir = repo / ".git"
    return {str(p.relative_to(git_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(git_dir.rglob("*")) if p.is_file()}


def test_no_command_of_the_repository_runs_and_the_export_is_the_commits_blobs(tmp_path: Path, cache: Path) -> None:
    repo, marks = _hostile_repo(tmp_path, cache)
    before = _state(repo)
    commit = revisions.commit_of(repo, "HEAD")

    exported, provenance = revisions.export(repo, "HEAD", tmp_path / "cache")
    assert provenance["git_commit"] == commit
    assert sources.git_provenance(repo)["git_state"] == "clean"  # racy files hashed as they are
    assert patching.assess(repo, patching.load_patch("backport")).text == patching.APPLIES
    info = history.commit_info(repo, commit)
    assert info.pr == 7 and info.files == [str(FUSER)]
    changes = history.ops_changes(repo, f"{commit}~1", commit)
    assert changes and changes["commits"] == [f"{commit[:7]} a fork (#7)"]

    assert sorted(p.name for p in marks.iterdir()) == []
    assert _state(repo) == before
    blob = safegit.run(repo, "cat-file", "blob", f"HEAD:{FUSER}", binary=True).stdout
    assert (exported / FUSER).read_bytes() == blob and b"$Format:%H$" in blob
    assert safegit.tree_hash(exported / "transformer_engine") == git(repo, "rev-parse", "HEAD:transformer_engine")


def test_a_plain_git_call_would_have_run_them(tmp_path: Path, cache: Path) -> None:
    """The repository above is hostile: git's defaults run its filters and its fsmonitor."""
    repo, marks = _hostile_repo(tmp_path, cache)
    git(repo, "archive", "--format=tar", "-o", str(tmp_path / "a.tar"), "HEAD", "--", str(FUSER))
    git(repo, "status", "--porcelain")
    assert {"smudge", "clean", "fsmonitor"} <= {p.name for p in marks.iterdir()}


def test_a_symlink_or_a_submodule_in_a_revision(tmp_path: Path, cache: Path) -> None:
    repo, _ = _hostile_repo(tmp_path, cache)
    (repo / "transformer_engine/escape.py").symlink_to("/etc/passwd")
    git(repo, "add", "-A")
    git(repo, "-c", "core.fsmonitor=false", "-c", "filter.evil.clean=cat", "commit", "-q", "-m", "a link")
    with pytest.raises(UsageError, match="symlink at 'transformer_engine/escape.py'"):
        revisions.export(repo, "HEAD", tmp_path / "cache")


def test_the_tree_hash_is_gits(tmp_path: Path) -> None:
    (tmp_path / "d/sub").mkdir(parents=True)
    (tmp_path / "d/a.py").write_text("a\n")
    (tmp_path / "d/sub/b").write_bytes(b"\x00\x01")
    (tmp_path / "d/sub/run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "d/sub/run.sh").chmod(0o755)
    (tmp_path / "d/a-b").write_text("a name that sorts before a.py\n")
    (tmp_path / "d/sub.txt").write_text("git sorts the directory as 'sub/': after sub.txt\n")
    git(tmp_path / "d", "init", "-q")
    git(tmp_path / "d", "add", "-A")
    expected = git(tmp_path / "d", "write-tree")
    shutil.rmtree(tmp_path / "d/.git")
    assert safegit.tree_hash(tmp_path / "d") == expected
    git(tmp_path / "d", "init", "-q", "--object-format=sha256")  # a repository of the newer hash
    git(tmp_path / "d", "add", "-A")
    expected_sha256 = git(tmp_path / "d", "write-tree")
    shutil.rmtree(tmp_path / "d/.git")
    assert len(expected_sha256) == 64 and safegit.tree_hash(tmp_path / "d", like=expected_sha256) == expected_sha256
    (tmp_path / "d/sub/b").write_bytes(b"\x00\x02")
    assert safegit.tree_hash(tmp_path / "d") != expected


def test_a_changed_or_added_file_in_a_cached_revision_is_exported_again(tmp_path: Path, cache: Path) -> None:
    repo, _ = _hostile_repo(tmp_path, cache)
    exported, _ = revisions.export(repo, "HEAD", tmp_path / "cache")
    good = (exported / FUSER).read_bytes()
    (exported / FUSER).write_bytes(good.replace(b"requires_grad_", b"edited_in_the_cache"))
    assert revisions.export(repo, "HEAD", tmp_path / "cache")[0] == exported
    assert (exported / FUSER).read_bytes() == good
    (exported / "transformer_engine/pytorch/ops/fuser").mkdir()
    (exported / "transformer_engine/pytorch/ops/fuser/__init__.py").write_text("OperationFuser = None\n")
    revisions.export(repo, "HEAD", tmp_path / "cache")
    assert not (exported / "transformer_engine/pytorch/ops/fuser").exists()



def test_a_revision_with_an_outsized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A 400 MB file in a revision once peaked at 1.28 GB: the export now refuses a file past its
    bound, naming it, before reading any blob, and leaves nothing in the cache."""
    repo, cache = tmp_path / "fork", tmp_path / "cache"
    (repo / "transformer_engine/pytorch/ops").mkdir(parents=True)
    (repo / FUSER).write_text("# a fuser\n")
    with (repo / "transformer_engine/weights.bin").open("wb") as big:  # zeros: a small repository all the same
        big.truncate(safegit.MAX_FILE_BYTES + 1)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a fork with a large file")
    with pytest.raises(UsageError, match=r"transformer_engine/weights.bin is 67,108,865 bytes; a file of a TE"
                                         r" tree to test may be at most 67,108,864 bytes \(64 MiB\)"):
        revisions.export(repo, "HEAD", cache)
    assert not any((cache / "revisions").glob("*/")), list((cache / "revisions").iterdir())
