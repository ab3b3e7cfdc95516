"""nox sessions for CI and people. Each installs what it needs itself."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"


def _install(session: nox.Session) -> None:
    session.install("torch==2.13.0")  # pinned: an unpinned torch pulls a CUDA build
    session.install("-e", ".[dev]")


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "-n", "auto", *session.posargs)


@nox.session
def smoke(session: nox.Session) -> None:
    _install(session)
    session.run("repro", "run", "--matrix", "smoke", *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    _install(session)
    session.run("repro", "run", "--matrix", "issue22", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
