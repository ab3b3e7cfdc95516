"""`repro exec --target SPEC -- COMMAND ...`: run a user's own command (a TE script, a snippet,
pytest) with that target's TE importable as `transformer_engine`."""

from __future__ import annotations

import argparse
import os
import subprocess

from harness import targets
from harness.errors import UsageError
from harness.targets import sources

EXAMPLE = "example: repro exec --target te-2.13.0 -- python case.py"


def cmd_exec(args: argparse.Namespace) -> int:
    from harness.targets.site import exec_environment

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError(f"exec needs a command after --; {EXAMPLE}")
    prepared = targets.prepare(args.target, sources.cache_dir(args.cache_dir), args.offline)
    if prepared.patch_status == "conflict":
        raise UsageError(f"target {prepared.spec}: patch {prepared.patch} does not apply; pick another target")
    try:
        code = subprocess.run(command, env=exec_environment(prepared, args.megatron, dict(os.environ)),
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
