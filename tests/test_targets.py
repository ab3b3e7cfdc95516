"""Targets load, the minimal scenario behaves as the bug report says, patches get one status."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from harness import targets
from harness.errors import UsageError
from harness.targets import patching, sources
from harness.targets.probing import probe
from tests.conftest import repro


@pytest.mark.parametrize("spec", targets.DEFAULT_TARGETS)
def test_minimal_scenario(spec: str, cache: Path) -> None:
    report = probe(targets.prepare(spec, cache), minimal=True)
    assert report["load_error"] is None
    outcome = report["minimal"]
    if spec == "te-2.13.0":
        assert not outcome["completed"]
        assert outcome["error"]["type"] == "RuntimeError"
        assert "you can only change requires_grad flags of leaf variables" in outcome["error"]["message"]
        assert outcome["error"]["location"].startswith("transformer_engine/pytorch/ops/fuser.py:")
    else:
        assert outcome["completed"], outcome


def test_patch_statuses(cache: Path, tmp_path: Path) -> None:
    assert targets.prepare("te-2.13.0+backport", cache).patch_status == "applied"
    upstream = targets.prepare("te-2.16.0+backport", cache)
    assert upstream.patch_status == "already-applied"
    assert "marker" in upstream.patch_detail
    # A deliberately altered 2.13.0: the context our patch needs is gone.
    altered = tmp_path / "altered"
    shutil.copytree(Path(targets.prepare("te-2.13.0", cache).root) / "transformer_engine", altered / "transformer_engine")
    fuser = altered / sources.FUSER_RELPATH
    fuser.write_text(fuser.read_text().replace("basic_op_kwargs: list[dict[str, Any]],", "kwargs_renamed: list,"))
    conflicted = targets.prepare(f"path:{altered}+backport", cache)
    assert conflicted.patch_status == "conflict"
    assert "fuser.py" in conflicted.patch_detail
    assert fuser.read_text().count("kwargs_renamed") == 1  # the path target itself is never written to


def test_patch_outside_tree_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evil.patch").write_text("--- a/../outside.py\n+++ b/../outside.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "evil.toml").write_text('patch = "evil.patch"\n')
    with pytest.raises(UsageError, match="outside the source tree"):
        patching.load_patch("evil", tmp_path)


def test_zip_slip_wheel_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "transformer_engine-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("../../escaped.py", "x = 1\n")
    with pytest.raises(UsageError, match="points outside its destination"):
        sources.unpack_wheel(wheel, tmp_path / "cache", "te-0.0.1")
    assert not (tmp_path / "escaped.py").exists()
    assert not (tmp_path / "cache" / "src" / "te-0.0.1").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["targets", "te-banana"], "unknown target spec"),
        (["targets", "path:/nonexistent/te"], "is not a directory"),
        (["targets", "te-2.13.0+nosuchpatch"], "unknown patch"),
        (["minimal", "--target", "te-9.9.9"], "not on the package index"),
        (["run", "--matrix", "nosuch"], "unknown matrix"),
        (["run", "--only", "grad_mode=sideways"], "unknown grad_mode value"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = repro(*args, check_rc=2)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_offline_cache_miss(tmp_path: Path) -> None:
    result = repro("targets", "te-2.13.0", "--offline", "--cache-dir", str(tmp_path / "empty"), check_rc=2)
    assert "not in the cache" in result.stderr and "without --offline" in result.stderr


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = repro("targets", "--cache-dir", str(blocker / "sub"), check_rc=2)
    assert "is not writable" in result.stderr


def test_unwritable_out_dir_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = repro("run", "--matrix", "smoke", "--out", str(blocker / "run"), check_rc=2)
    assert "output dir" in result.stderr and "not writable" in result.stderr
    assert list(tmp_path.iterdir()) == [blocker]


def test_huge_selection_is_refused_with_its_size() -> None:
    result = repro("run", "--matrix", "full", "--max-cases", "5000", check_rc=2)  # full holds 7,200 valid cases
    assert "selection has" in result.stderr and "--max-cases" in result.stderr


def test_version_not_on_index_leaves_no_partial_cache(tmp_path: Path) -> None:
    repro("targets", "te-9.9.9", "--cache-dir", str(tmp_path / "cache"), check_rc=2)
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert leftovers == []
