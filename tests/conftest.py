"""Shared fixtures. A process can hold one TE target, so in-process tests share one
loaded target; everything else runs targets in subprocesses through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import targets
from harness.targets import sources

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cache() -> Path:
    return sources.cache_dir()


@pytest.fixture(scope="session")
def loaded_target(cache: Path):
    """te-2.20.2 loaded into this test process (the only target it ever loads)."""
    from harness.engine.execute import import_megatron
    from harness.targets.loader import load

    target = load(targets.prepare("te-2.20.2", cache))
    import_megatron("cpu")  # after the target: megatron probes `import transformer_engine`
    return target


def repro(*args: str, check_rc: int | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, check=False, cwd=REPO,
                            env=env)
    if check_rc is not None:
        assert result.returncode == check_rc, result.stdout + result.stderr
    return result
