"""A run's scratch folder (harness.runner.scratch): in the run dir, gone when the run is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.runner import rundir, scratch


def test_the_scratch_folder_is_removed_and_torchs_cache_folder_given_back(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(scratch.INDUCTOR_CACHE, raising=False)
    with pytest.raises(KeyboardInterrupt), scratch.scratch(tmp_path) as env:
        folder = Path(env["TMPDIR"])
        assert folder.parent == tmp_path and folder.name.startswith(scratch.PREFIX)
        assert os.environ[scratch.INDUCTOR_CACHE] == env[scratch.INDUCTOR_CACHE] == str(folder / "torch")
        (folder / "left-by-a-case").mkdir()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    assert scratch.INDUCTOR_CACHE not in os.environ


def test_a_cache_folder_the_user_named_stays_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(scratch.INDUCTOR_CACHE, "/users/own/cache")
    with scratch.scratch(tmp_path) as env:
        assert env[scratch.INDUCTOR_CACHE] == "/users/own/cache"
    assert os.environ[scratch.INDUCTOR_CACHE] == "/users/own/cache"


def test_a_killed_runs_scratch_folder_goes_with_its_stale_files_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / f"{scratch.PREFIX}abc123" / "pytest-of-root").mkdir(parents=True)
    (tmp_path / "users-notes.txt").write_text("mine")
    (tmp_path / "scratch-but-not-ours").mkdir()
    rundir.remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch-but-not-ours", "users-notes.txt"]


def test_a_command_without_a_run_dir_gets_a_scratch_folder_that_goes_with_it() -> None:
    with scratch.temporary() as env:
        folder = Path(env["TMPDIR"])
        assert folder.is_dir() and folder.name.startswith(scratch.PREFIX)
        (folder / "torch").mkdir()
    assert not folder.exists() and not folder.parent.exists()
