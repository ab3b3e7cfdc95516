"""Data flows one way: no module of the project imports, directly or through others, a module
that imports it back (DESIGN.md's shape). Read from the source with `ast`, every import counted,
also those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("repro", "harness", "cases")
# No cycle is known: the circle through cases/ and the standalone reproducer (issue 27) is gone
# (a Case reads its regression's axes from a registry the declarations fill).
KNOWN: set[frozenset[str]] = set()


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in REPO.glob("*/**/*.py"):
        if path.parts[len(REPO.parts)] in PACKAGES:
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` depends on the submodule; the package's own
                # __init__ runs before any submodule of it, which is no edge of the design.
                names = [f"{node.module}.{a.name}" for a in node.names]
                targets = names if all(n in modules for n in names) else [*names, node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_the_rendering_has_no_circle() -> None:
    cycles = _cycles(_graph())
    assert not [c for c in cycles if any(m.startswith("repro.") for m in c)], cycles


def test_no_new_import_cycle() -> None:
    assert [c for c in _cycles(_graph()) if c not in KNOWN] == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def test_the_cli_and_the_catalogue_import_no_torch() -> None:
    """Every `repro` command reads the catalogue and starts its sessions before it judges: torch (two
    seconds) is imported where a case is built, computed or judged, never by the CLI's own imports."""
    import subprocess
    import sys

    code = ("import sys, repro.cli, cases.matrix, harness.runner.sessions, harness.bench\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.strip() == "[]", result.stdout[:300]


def test_a_run_starts_its_first_session_before_importing_torch(tmp_path: Path) -> None:
    """`repro run` plans the matrix (each of its candidate cases), prepares its targets and starts the
    first session without torch: the judge imports it when the first observation comes, beside the
    workers' start-up instead of before it."""
    import subprocess
    import sys

    code = ("import os, sys\nfrom harness.runner import sessions\nfrom repro.cli import main\n"
            "def first(*args, **kwargs):\n"
            "    print('torch' in sys.modules, flush=True)\n    os._exit(0)\n"
            "sessions._start_session = first\n"
            f"sys.argv = ['repro', 'run', '--matrix', 'all', '-n', '2', '--out', {str(tmp_path / 'run')!r}]\nmain()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO)
    assert result.stdout.strip() == "False", result.stdout[-300:] + result.stderr[-2000:]
