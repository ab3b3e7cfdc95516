"""The `repro` command line. It parses, calls the engine and prints; no engine logic here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tabulate import tabulate

from harness import targets
from harness.errors import TargetLoadError, UsageError
from harness.targets import sources
from harness.targets.probing import probe
from repro import validate


def _prepare_row(spec: str, cache, offline: bool,
                 fork_config: str | None) -> tuple[targets.PreparedTarget | None, str | None]:
    try:
        return targets.prepare(spec, cache, offline, fork_config), None
    except TargetLoadError as exc:
        return None, str(exc)


def _provenance(prepared: targets.PreparedTarget) -> str:
    git = prepared.provenance
    return f" (git {git['git_commit'][:12]} on {git['git_branch']}, {git['git_state']})" if git else ""


def cmd_targets(args: argparse.Namespace) -> int:
    specs = args.specs or list(targets.DEFAULT_TARGETS)
    for spec in specs:
        targets.parse_spec(spec)
    targets.check_unique(specs)
    cache = sources.cache_dir(args.cache_dir)
    rows = []
    for spec in specs:
        prepared, error = _prepare_row(spec, cache, args.offline, args.fork_config)
        if prepared is None:
            rows.append([spec, "-", "-", "-", "-", "-", f"unavailable: {error}"])
            continue
        report = probe(prepared) if prepared.patch_status != "conflict" else {"load_error": "not loaded: patch conflict"}
        status = "loaded" if not report["load_error"] else f"error: {report['load_error']}"
        patch = prepared.patch_status if not prepared.patch else f"{prepared.patch_status} ({prepared.patch_detail.splitlines()[0] if prepared.patch_detail else ''})"
        rows.append([prepared.spec, prepared.kind + ": " + prepared.source + _provenance(prepared), prepared.version,
                     f"{prepared.fuser_sha} ({prepared.content_sha})", patch, prepared.backend, status])
        if report.get("description"):
            rows[-1][-1] += f" — {report['description']}"
    print(tabulate(rows, headers=["spec", "source", "version", "fuser.py (all files)", "patch", "backend", "load"]))
    return 0


def cmd_minimal(args: argparse.Namespace) -> int:
    targets.parse_spec(args.target)
    cache = sources.cache_dir(args.cache_dir)
    prepared = targets.prepare(args.target, cache, args.offline, args.fork_config)
    if prepared.patch_status == "conflict":
        print(f"{prepared.spec}: patch {prepared.patch} conflicts:\n{prepared.patch_detail}")
        return 1
    report = probe(prepared, minimal=True)
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


def build_parser() -> argparse.ArgumentParser:
    parser = validate.OneLineParser(prog="repro", description="Reproduce and verify TE op-fuser issue 22.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", help=f"target cache (default ${sources.CACHE_ENV} or the XDG cache dir)")
    common.add_argument("--offline", action="store_true", help="use only the cache; never download")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("targets", parents=[common], help="list targets with their source, hash and patch status")
    p.add_argument("specs", nargs="*", help=f"target specs ({targets.SPEC_FORMS}); +name is a patch only when "
                   "patches/name.toml exists; end a path in / to keep a +name that is a patch's")
    p.add_argument("--fork-config", metavar="FILE", help="a fork's TOML config for path: and installed targets")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("minimal", parents=[common], help="run the bug report's minimal scenario on one target")
    p.add_argument("--target", required=True, metavar="SPEC", help=f"one target ({targets.SPEC_FORMS})")
    p.add_argument("--fork-config", metavar="FILE", help="a fork's TOML config for a path: or installed target")
    p.set_defaults(func=cmd_minimal)

    from repro import bench_commands, report_commands, run_commands

    for commands in (run_commands, report_commands, bench_commands):
        commands.add_parsers(sub, common)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except (UsageError, TargetLoadError) as exc:
        print(f"repro: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("repro: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
