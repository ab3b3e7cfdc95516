"""Shared fixtures. A process can hold one TE target, so in-process tests share one
loaded target; everything else runs targets in subprocesses through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from harness import targets
from harness.targets import sources

REPO = Path(__file__).resolve().parent.parent

# The suite runs beside heavy runs on two cores: how fast hypothesis generates or runs an example says
# nothing about the property, and timed health checks failed it under load (too_slow, 2 inputs in 3.3 s).
settings.register_profile("loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded-machine")


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
