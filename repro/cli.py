"""The `repro` command line. It parses, calls the engine and prints; no engine logic here."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from tabulate import tabulate

from harness import targets
from harness.errors import TargetLoadError, UsageError
from harness.runner import sandbox
from harness.runner.textsafe import printable
from harness.targets import patching, sources
from harness.targets.probing import PROBE_TIMEOUT_S, probe
from repro import validate


def _prepare_row(spec: str, cache, offline: bool,
                 fork_config: str | None) -> tuple[targets.PreparedTarget | None, str | None]:
    try:
        return targets.prepare(spec, cache, offline, fork_config), None
    except TargetLoadError as exc:
        return None, str(exc)


def _provenance(prepared: targets.PreparedTarget) -> str:
    from repro.reports import provenance_text

    text = provenance_text({"provenance": prepared.provenance})
    return f" ({text})" if text else ""


def cmd_targets(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from cases.regressions import REGRESSIONS
    from harness.runner.roles import predates_all
    from repro.reports import patch_text

    specs = [targets.canonical_spec(spec) for spec in args.specs or list(targets.DEFAULT_TARGETS)]
    targets.check_unique(specs)
    cache = sources.cache_dir(args.cache_dir)
    rows = []
    for spec in specs:
        prepared, error = _prepare_row(spec, cache, args.offline, args.fork_config)
        if prepared is None:
            rows.append([spec, "-", "-", "-", "-", "-", f"unavailable: {error}"])
            continue
        report = probe(prepared, timeout=args.load_timeout) if prepared.patch_status != "conflict" else {"load_error": "not loaded: patch conflict"}
        status = "loaded" if not report["load_error"] else f"error: {report['load_error']}"
        patch = patch_text(asdict(prepared))
        if prepared.patch and prepared.patch_text:  # the reviewer's answer beside the two parts
            fixes = [REGRESSIONS[r] for r in patching.load_patch(prepared.patch).fixes if r in REGRESSIONS]
            patch += " — " + (f"no backport needed: release {prepared.version} predates what it fixes"
                              if predates_all(fixes, prepared.version) else
                              patching.Assessment(prepared.patch_text, prepared.patch_text_detail, prepared.patch_fix,
                                                  prepared.patch_fix_detail).advice(prepared.patch))
        rows.append([prepared.spec, prepared.kind + ": " + prepared.source + _provenance(prepared), prepared.version,
                     f"{prepared.fuser_sha} ({prepared.content_sha})", patch, prepared.backend, status])
        if report.get("description"):
            rows[-1][-1] += f" — {report['description']}"
    print(tabulate(printable(rows), headers=["spec", "source", "version", "fuser.py (all files)", "patch", "backend",
                                             "load"]))
    print(sandbox.status_line())
    return 0


def cmd_minimal(args: argparse.Namespace) -> int:
    if args.client is None and (args.megatron or args.recompute):
        raise UsageError("--megatron and --recompute go with --client (megatron_norm or megatron_block)")
    if args.client is not None:
        from repro.megatron_commands import check_client_args

        check_client_args(args)
    targets.parse_spec(args.target)
    cache = sources.cache_dir(args.cache_dir)
    prepared = targets.prepare(args.target, cache, args.offline, args.fork_config)
    if prepared.patch_status == "conflict":
        print(f"{prepared.spec}: patch {prepared.patch} conflicts:\n{prepared.patch_detail}")
        return 1
    if args.client is not None:
        from repro.megatron_commands import minimal_client

        return minimal_client(args, prepared, cache)
    report = printable(probe(prepared, minimal=True, timeout=args.load_timeout))
    if report["load_error"]:
        print(f"{prepared.spec}: could not load: {report['load_error']}")
        return 1
    outcome = report["minimal"]
    print(f"target {prepared.spec} (fuser.py {prepared.fuser_sha}, patch {prepared.patch_status})")
    print("scenario: Sequential(MakeExtraOutput(), RMSNorm) on a non-leaf input under torch.no_grad()")
    if outcome["completed"]:
        print(f"completed: outputs {outcome['output_shapes']}")
    else:
        error = outcome["error"]
        print(f"raised {error['type']} at {error['location']}: {error['message']}")
    return 0


EXAMPLES = {
    "targets": "repro targets te-2.13.0 te-2.13.0+backport installed",
    "minimal": "repro minimal --target te-2.13.0",
    "run": "repro run --matrix issue22   (or: repro run --from-run runs/issue22 --last-failed)",
    "list": "repro list --matrix issue22 --only pipeline=identity",
    "sweep": "repro sweep --matrix issue22 --from 2.1.0 --to latest",
    "devices": "repro devices",
    "regressions": "repro regressions",
    "schema": "repro schema > run.schema.json",
    "bench": "repro bench --matrix smoke --targets te-2.13.0,te-2.16.0",
    "review": "repro review --base path:../fork@HEAD~1 --head path:../fork@HEAD",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help (unless the help already says it); examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return super()._get_help_string(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("te-fuser-repro")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = validate.OneLineParser(
        prog="repro", formatter_class=HelpFormatter,
        description="Reproduce and verify Transformer Engine op-fuser regressions across releases, forks and patches.",
        epilog="Run `repro COMMAND --help` for a command's options. Without a command, repro prints this help"
               " (exit status 0).\nexample: repro run --matrix issue22")
    parser.add_argument("--version", action="version", version=f"repro {_version()}")
    common = validate.common_options()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("targets", parents=[common], help="list targets with their source, hash and patch status")
    p.add_argument("specs", nargs="*", help=f"target specs ({targets.SPEC_FORMS}); +name is a patch only when "
                   "patches/name.toml exists; end a path in / to keep a +name that is a patch's")
    p.add_argument("--fork-config", metavar="FILE", help="a fork's TOML config for path: and installed targets")
    p.add_argument("--load-timeout", type=validate.timeout_seconds, default=PROBE_TIMEOUT_S,
                   help="seconds to load each target before it is reported as timed out")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("minimal", parents=[common], help="run the bug report's minimal scenario on one target")
    p.add_argument("--target", required=True, metavar="SPEC", help=f"one target ({targets.SPEC_FORMS})")
    p.add_argument("--fork-config", metavar="FILE", help="a fork's TOML config for a path: or installed target")
    p.add_argument("--client", help="run it through Megatron's own code: megatron_norm or megatron_block")
    p.add_argument("--megatron", help="with --client: a megatron-core version (default 0.19.0) or path:<dir>")
    p.add_argument("--recompute", help="with --client: megatron_block: full_block (default), full_uniform, none; "
                   "megatron_norm: megatron_checkpoint (default), none")
    p.add_argument("--load-timeout", type=validate.timeout_seconds, default=PROBE_TIMEOUT_S,
                   help="seconds to load the target and run the scenario before it is reported as timed out")
    p.set_defaults(func=cmd_minimal)

    from repro import (
        bench_commands,
        bisect_command,
        coverage_command,
        exec_command,
        report_commands,
        review_commands,
        run_commands,
        shrink_command,
        upstream_command,
    )

    for commands in (run_commands, report_commands, exec_command, bench_commands, review_commands, upstream_command,
                     bisect_command, coverage_command, shrink_command):
        commands.add_parsers(sub, common)
    for name, subparser in sub.choices.items():
        subparser.formatter_class = HelpFormatter
        if not subparser.epilog and name in EXAMPLES:
            subparser.epilog = f"example: {EXAMPLES[name]}"
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:  # bare `repro`: the help, not an error
            parser.print_help()
            return 0
        if getattr(args, "no_sandbox", False):  # every process this command starts runs target code unsandboxed
            os.environ[sandbox.DISABLE_ENV] = "1"
        return args.func(args)
    except (UsageError, TargetLoadError) as exc:
        print(f"repro: error: {_one_line(printable(str(exc)))}", file=sys.stderr)  # it may echo a hostile path
        return 2
    except RuntimeError as exc:
        # pathlib's resolve() on a path the user gave that loops; the targets never run in this process.
        if not str(exc).startswith("Symlink loop from "):
            raise
        loop = str(exc).removeprefix("Symlink loop from ")
        print(f"repro: error: {_one_line(printable(loop))} is a symlink loop; give a path that resolves",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("repro: interrupted", file=sys.stderr)
        return 130


def console() -> None:
    """The `repro` command: main(), then out without finalizing the interpreter. Finalizing one
    that holds torch and a run of thousands of results takes a second or more after the last
    report, for nothing: every file the command writes is closed by then, and every child of
    it has ended. An exception still leaves the ordinary way, with its traceback."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError):  # its reader has gone (`repro ... | head`)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    console()
