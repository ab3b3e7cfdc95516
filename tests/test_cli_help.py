"""The command line's help, version and nox sessions."""

from __future__ import annotations

import argparse
import importlib.util
import re

import pytest

from repro.cli import build_parser, main
from tests.conftest import REPO, repro


def test_bare_repro_prints_help_and_exits_0() -> None:
    result = repro(check_rc=0)
    assert result.stdout.startswith("usage: repro") and "COMMAND" in result.stdout and result.stderr == ""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert re.fullmatch(r"repro \S+.*\n", capsys.readouterr().out)


def test_every_subcommand_help_has_an_example_and_defaults() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps them here
    for name, sub in commands.items():
        text = sub.format_help()
        assert "example: repro " in text, name
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in (action.help or "") or "default" in sub._get_formatter()._get_help_string(
                    action), f"{name} {action.option_strings}"
    assert re.search(r"\(default:? issue22\)", commands["run"].format_help())
    assert re.search(r"\(default:\s+120\)", commands["run"].format_help())  # added by the formatter


def test_nox_defaults_and_docstrings() -> None:
    nox = pytest.importorskip("nox", reason="nox is a dev dependency")
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sessions = {name: getattr(module, name) for name in ("tests", "smoke", "matrix", "lint", "sweep", "npu", "cuda",
                                                         "report", "typecheck")}
    assert all(s.__doc__ for s in sessions.values())
    assert set(nox.options.sessions) == {"lint", "tests", "smoke", "matrix", "typecheck"}
    assert not {"npu", "cuda", "sweep", "report"} & set(nox.options.sessions)
