"""A target's TE, importable as `transformer_engine` in a user's own process (`repro exec`).

`exec_environment` gives the child process an environment whose PYTHONPATH starts with
exec_boot/, whose sitecustomize.py calls `activate` at interpreter start-up: the target is
loaded through the same loader as a run (the CPU backend, or the native install), and on the
CPU backend the whole package is TE's own as shipped, so `import transformer_engine.pytorch
as te; te.ops.Sequential(...)` works as it does with an installed TE (only the compiled
extension's kernels are stood in).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.targets import PreparedTarget

BOOT_DIR = Path(__file__).resolve().parent / "exec_boot"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TARGET_ENV = "REPRO_EXEC_TARGET"
MEGATRON_ENV = "REPRO_EXEC_MEGATRON"
LOADING_ENV = "REPRO_EXEC_LOADING"
# Directories (os.pathsep-separated) whose calls the CPU backend's device answers serve besides
# the target's files: `repro upstream-tests` names the checkout's tests.
ANSWER_ALSO_ENV = "REPRO_EXEC_DEVICE_ANSWERS_ALSO"


def exec_environment(prepared: PreparedTarget, megatron: bool, base: dict[str, str],
                     answer_also: tuple[Path, ...] = ()) -> dict[str, str]:
    """The child's environment: the boot folder and the project first on PYTHONPATH, the target named."""
    path = [str(BOOT_DIR), str(PROJECT_ROOT)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])
    env = {**base, "PYTHONPATH": os.pathsep.join(path), TARGET_ENV: prepared.to_json(),
           # The target's files are a source under test: never write bytecode next to them.
           "PYTHONDONTWRITEBYTECODE": "1"}
    if megatron:
        env[MEGATRON_ENV] = "1"
    if answer_also:
        env[ANSWER_ALSO_ENV] = os.pathsep.join(str(d) for d in answer_also)
    return env


def activate() -> None:
    """Load the target named in the environment (no-op without one); exit 2 with one line if it cannot load."""
    text = os.environ.get(TARGET_ENV)
    if not text or os.environ.get(LOADING_ENV):
        return
    # A release that runs Python while it loads (2.1-2.3 ask `python -m pip show`) must not
    # load the target again in that child; children of the user's command (pytest's workers) do.
    os.environ[LOADING_ENV] = "1"
    from harness.errors import TargetLoadError
    from harness.targets.loader import load

    prepared = PreparedTarget.from_json(text)
    try:
        also = tuple(Path(d) for d in os.environ.get(ANSWER_ALSO_ENV, "").split(os.pathsep) if d)
        with _stdout_to_stderr():
            loaded = load(prepared, also)
            if os.environ.get(MEGATRON_ENV):
                # After the target: Megatron probes TE at import and must find this one; its RNG
                # bookkeeping is pointed at the CPU generator on a CPU-only host.
                from harness.engine.execute import import_megatron

                import_megatron("cpu")
    except (TargetLoadError, Exception) as exc:  # noqa: BLE001 — whatever a fork raises at import: one line
        # os._exit, not sys.exit: SystemExit in sitecustomize is a "Fatal Python error" with a page of output.
        what = str(exc) if isinstance(exc, TargetLoadError) else f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"repro exec: {' '.join(what.split())}\n")
        sys.stderr.flush()
        os._exit(2)
    finally:
        os.environ.pop(LOADING_ENV, None)
    if prepared.backend != "native":
        expose_ops(loaded.ops)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """What the target prints while it loads goes to stderr, at the file descriptor: this runs
    before the command's own start-up, whose stdout may be a protocol (pytest-xdist's workers
    answer their controller on it; TransformerEngine-FL logs its op manager to stdout at import)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def expose_ops(ops: dict[str, object]) -> None:
    """te.ops.<Name> for every op the loaded target has; names TE's module already defines are kept."""
    namespace = sys.modules["transformer_engine.pytorch.ops"]
    for name, value in ops.items():
        if not hasattr(namespace, name):
            setattr(namespace, name, value)
