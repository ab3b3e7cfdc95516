"""`repro exec --target SPEC -- COMMAND ...`: run a user's own command (a TE script, a snippet,
pytest) with that target's TE importable as `transformer_engine`, in a sandbox (harness.runner.sandbox)
whose writable folders are its private tmp and the working directory (unless that is the project's,
the Python installation's or the target cache's)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import targets
from harness.errors import UsageError
from harness.megatron.source import DEFAULT_VERSION, MEGATRON_ENV, prepare_megatron
from harness.runner import sandbox
from harness.targets import sources

EXAMPLE = "example: repro exec --target te-2.13.0 -- python case.py"


def _check_runnable(program: str, env: dict[str, str]) -> None:
    """The one-line errors for a command that is not there or not executable, found before the
    sandbox starts it (the sandbox can only report them as an exit status)."""
    if os.sep in program:
        if not os.path.exists(program):
            raise UsageError(f"command not found: {program}; {EXAMPLE}")
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise UsageError(f"command {program} is not executable; run it through its interpreter "
                             f"(python {program}) or chmod +x it; {EXAMPLE}")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise UsageError(f"command not found: {program}; {EXAMPLE}")


def _writable_here(cache: Path) -> list[str]:
    """The working directory stays writable for the command's own output, unless it is within the
    project, the Python installation or the target cache, which the sandbox keeps read-only."""
    here = Path.cwd().resolve()
    protected = [sandbox.PROJECT_ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), cache.resolve()]
    return [] if any(here == p or p in here.parents for p in protected) else [str(here)]


def cmd_exec(args: argparse.Namespace) -> int:
    from harness.targets.site import exec_environment

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError(f"exec needs a command after --; {EXAMPLE}")
    sandbox.require()
    cache = sources.cache_dir(args.cache_dir)
    prepared = targets.prepare(args.target, cache, args.offline)
    if prepared.patch_status == "conflict":
        raise UsageError(f"target {prepared.spec}: patch {prepared.patch} does not apply; pick another target")
    env = exec_environment(prepared, args.megatron, dict(os.environ))
    if args.megatron and MEGATRON_ENV not in env:  # prepared here: the cache is read-only in the sandbox
        env[MEGATRON_ENV] = prepare_megatron(DEFAULT_VERSION, cache, args.offline).to_json()
    _check_runnable(command[0], env)
    try:
        code = subprocess.run(sandbox.command(command, writable=_writable_here(cache)), env=env,
                              check=False).returncode
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]}; {EXAMPLE}") from None
    except PermissionError:
        raise UsageError(f"command {command[0]} is not executable; run it through its interpreter "
                         f"(python {command[0]}) or chmod +x it; {EXAMPLE}") from None
    except OSError as exc:  # ENOEXEC (no #! line), a directory, ...
        raise UsageError(f"cannot run {command[0]} ({exc.strerror}); {EXAMPLE}") from None
    # Killed by signal N: 128+N, as a shell reports it (subprocess gives -N).
    return 128 - code if code < 0 else code


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "exec", parents=[common], help="run your own command with a target's TE importable as transformer_engine",
        description=("Runs COMMAND with the target's TE importable as `transformer_engine` (`import"
                     " transformer_engine.pytorch as te`): on a machine without TE's compiled parts through the CPU"
                     " backend, else the native install. Exit status: the command's (128+N when a signal N ended it); 2 with"
                     " one line when the command is not found or not executable, or the target does not load."),
        epilog=EXAMPLE)
    p.add_argument("--target", required=True, metavar="SPEC", help=f"the TE to load ({targets.SPEC_FORMS})")
    p.add_argument("--megatron", action="store_true",
                   help="import megatron-core first, its RNG on the CPU generator (for Megatron recompute; default off)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    p.set_defaults(func=cmd_exec)
