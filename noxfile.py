"""nox sessions for CI and people. Each installs what it needs itself.

Bare `nox` runs the default sessions below. `npu` and `cuda` need a device host, `sweep` loads
every release, and `report` rewrites the reviewed report: run those by name (`nox -s report`).
`nox -l` lists every session with its docstring.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "smoke", "matrix", "typecheck"]


def _install(session: nox.Session) -> None:
    session.install("torch==2.13.0")  # pinned: an unpinned torch pulls a CUDA build
    session.install("-e", ".[dev]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, on every core (pytest -n auto); arguments go to pytest."""
    _install(session)
    session.run("python", "-m", "pytest", "-n", "auto", *session.posargs)


@nox.session
def smoke(session: nox.Session) -> None:
    """The smoke matrix over the default targets: a quick end-to-end run."""
    _install(session)
    session.run("repro", "run", "--matrix", "smoke", *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The issue22 matrix over the default targets, with every report format."""
    _install(session)
    session.run("repro", "run", "--matrix", "issue22", *session.posargs)


@nox.session
def generated(session: nox.Session) -> None:
    """The generated matrix on its default targets, then what it reached on each (not a default session)."""
    _install(session)
    session.run("repro", "run", "--matrix", "generated", "--out", "runs/generated", *session.posargs,
                success_codes=[0, 1])
    session.run("repro", "coverage", "runs/generated")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over the project."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def sweep(session: nox.Session) -> None:
    """The issue22 matrix over every release in a range (slow; not a default session)."""
    _install(session)
    session.run("repro", "sweep", "--matrix", "issue22", *session.posargs)


def _device_matrix(session: nox.Session, device: str) -> None:
    # For a GPU or Ascend host: the environment's own TE (and torch_npu) must be importable,
    # so this session reuses the interpreter's site-packages instead of a fresh torch.
    session.install("-e", ".")
    session.run("repro", "devices")
    session.run("repro", "run", "--matrix", "full", "--max-cases", "40000", "--only", f"device={device}",
                "--targets", "installed,installed+backport", *session.posargs)


@nox.session(venv_params=["--system-site-packages"])
def npu(session: nox.Session) -> None:
    """The full matrix on an Ascend host, with its installed TE and torch_npu (not a default session)."""
    _device_matrix(session, "npu")


@nox.session(venv_params=["--system-site-packages"])
def cuda(session: nox.Session) -> None:
    """The full matrix on a CUDA host, with its installed TE (not a default session)."""
    _device_matrix(session, "cuda")


@nox.session
def report(session: nox.Session) -> None:
    """Regenerate the reviewed report; `git diff reports/` then shows what changed (not a default session)."""
    _install(session)
    session.run("repro", "run", "--matrix", "issue22", "--out", "runs/issue22", success_codes=[0, 1])
    session.run("repro", "report", "runs/issue22", "--format", "verdict-md", "-o", "reports/issue-22.md")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over harness, cases and repro."""
    _install(session)
    session.install("mypy")
    session.run("mypy", "--ignore-missing-imports", "harness", "cases", "repro")
