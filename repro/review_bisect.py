"""`repro review`'s offer of `repro bisect`: when base and head are revisions of one
repository, for each signature change from base to head (the cases whose outcome, error
type, error file or failed checks changed, grouped by before and after), the bisect command
that names the upstream commit; with `--bisect`, its answer, run into the review's --out.

When a merge on head's first-parent line brought in another history (a fork syncing an
upstream tag), bisecting base..head only reaches the merge: the upstream commits it brought
are not on the fork's line. Then each change gets two offers, the upstream side first (from
the merge base of base and the merged commit to that commit: the upstream commit), then the
fork side (`--first-parent`: the fork's own commit, or the merge itself)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness import targets
from harness.errors import UsageError
from harness.runner import bisect
from harness.targets import history, revisions
from repro import validate
from repro.render_md import code, plain

CASES_PER_OFFER = 5  # a signature's first cases: they change at one commit, and each step stays small
MERGES_OFFERED = 2  # upstream sides per change: the sync, and one more merged branch at most


def _revision(spec: str) -> tuple[str, str] | None:
    """(DIR as the user wrote it, REV) of a path:DIR@REV spec without a patch."""
    parsed = targets.parse_spec(spec)
    directory, rev = revisions.split(parsed.value) if parsed.kind == "path" and not parsed.patch else ("", None)
    return (directory, rev) if rev is not None else None


def _revision_dir(spec: str) -> Path | None:
    revision = _revision(spec)
    return Path(revision[0]).expanduser().resolve() if revision else None


def one_repository(base: str, head: str) -> bool:
    """Whether base and head are revisions (path:DIR@REV) of one git repository."""
    dirs = [_revision_dir(base), _revision_dir(head)]
    if None in dirs:
        return False
    try:
        return history.repository(dirs[0]) == history.repository(dirs[1])  # type: ignore[arg-type]
    except UsageError:
        return False


def upstream_sides(base: str, head: str) -> list[dict[str, Any]]:
    """For each merge on head's first-parent line since base that brought in another history
    (largest first, at most MERGES_OFFERED): the upstream ends to bisect, as specs in head's
    directory (a tag where one points at the commit), and what the offer says about them."""
    base_rev, head_rev = _revision(base), _revision(head)
    assert base_rev is not None and head_rev is not None  # one_repository() said so
    directory = Path(head_rev[0]).expanduser().resolve()
    base_commit, head_commit = history.resolve(directory, base_rev[1]), history.resolve(directory, head_rev[1])
    sides = []
    for merge in history.merges_since(directory, base_commit, head_commit)[:MERGES_OFFERED]:
        good, bad = history.readable(directory, merge.merge_base), history.readable(directory, merge.merged)
        sides.append({"good": f"path:{head_rev[0]}@{good}", "bad": f"path:{head_rev[0]}@{bad}",
                      "merge": merge.commit, "merge_subject": merge.subject, "merged": merge.merged,
                      "merge_base": merge.merge_base, "brought": merge.brought,
                      "what": f"what merge {merge.commit[:12]} ({merge.subject[:60]}) brought in: {good}..{bad},"
                              f" {merge.brought} commit{'s' if merge.brought != 1 else ''} the base lacks"})
    return sides


def _offer(before: Any, after: Any, cases: list[str], argv: list[str], side: str, what: str) -> dict[str, Any]:
    chosen = [x for case in cases[:CASES_PER_OFFER] for x in ("--case", case)]
    return {"before": bisect.signature_text(before), "after": bisect.signature_text(after), "cases": len(cases),
            "side": side, "what": what, "argv": [*argv, *chosen],
            "command": shlex.join(["repro", "bisect", *argv, *chosen])}


def offers(run: dict[str, Any], base: str, head: str) -> list[dict[str, Any]]:
    """One offer per (signature at base, signature at head) pair that differs; after a merge
    of another history, per pair the upstream side(s) first, then the fork side."""
    if not one_repository(base, head):
        return []
    at_base = {r["case_id"]: bisect.signature(r) for r in run["results"] if r["target"] == base}
    groups: dict[tuple[Any, Any], list[str]] = defaultdict(list)
    for record in run["results"]:
        if record["target"] != head or record["case_id"] not in at_base:
            continue
        before, after = at_base[record["case_id"]], bisect.signature(record)
        if before is not None and after is not None and before != after:
            groups[(before, after)].append(record["case_id"])
    try:
        sides = upstream_sides(base, head) if groups else []
    except UsageError:  # history git cannot read (a shallow clone): the plain offer, never a failed review
        sides = []
    found = []
    for (before, after), cases in sorted(groups.items(), key=lambda item: -len(item[1])):
        if not sides:
            found.append(_offer(before, after, cases, ["--good", base, "--bad", head], "", ""))
            continue
        for side in sides:
            found.append(_offer(before, after, cases, ["--good", side["good"], "--bad", side["bad"]], "upstream",
                                side["what"]))
        found.append(_offer(before, after, cases, ["--good", base, "--bad", head, "--first-parent"], "fork",
                            "the fork's first-parent line, each merge one step"))
    return found


def run_offers(found: list[dict[str, Any]], out_dir: Path, args: argparse.Namespace) -> None:
    """Run each offered bisect into out_dir/bisect-N (its answer on stderr) and keep its answer."""
    from repro import bisect_command

    # repro bisect's own parser, not the CLI's: the CLI imports the review, which imports this module
    parser = validate.OneLineParser(prog="repro")
    bisect_command.add_parsers(parser.add_subparsers(dest="command"), validate.common_options())
    for number, offer in enumerate(found, 1):
        step_out = out_dir / f"bisect-{number}"
        extra = ["--cache-dir", args.cache_dir] if args.cache_dir else []
        parsed = parser.parse_args(["bisect", *offer["argv"], "--out", str(step_out), *extra,
                                    *(["--offline"] if args.offline else [])])
        with contextlib.redirect_stdout(sys.stderr):
            bisect_command.cmd_bisect(parsed)
        answer = json.loads((step_out / "bisect.json").read_text())
        offer["answer"] = {k: answer.get(k) for k in ("status", "reason", "commit", "candidates", "judged")}
        offer["answer"]["out"] = str(step_out)


def render_offers(found: list[dict[str, Any]]) -> str:
    """review.md's section: per changed signature, the command, and the commit when it ran."""
    if not found:
        return ""
    lines = ["", "## Which upstream commit changed them", ""]
    shown = None
    for offer in found:
        change = (f"{offer['cases']} case{'s' if offer['cases'] != 1 else ''}: {code(offer['before'], False)} →"
                  f" {code(offer['after'], False)}")
        indent = ""
        if not offer.get("side"):
            lines.append(f"- {change}: {code(offer['command'], False)}")
        else:  # a change bisected on each side of a merge: the change once, one item per side
            if (offer["before"], offer["after"]) != shown:
                lines.append(f"- {change}:")
            indent = "  "
            lines.append(f"  - {offer['side']} side ({plain(offer['what'])}): {code(offer['command'], False)}")
        shown = (offer["before"], offer["after"])
        answer = offer.get("answer")
        if answer is None:
            continue
        if answer.get("commit"):
            info = answer["commit"]
            pr = f" ([#{info['pr']}]({info['pr_link']}))" if info.get("pr_link") else ""  # else in the subject
            lines.append(f"{indent}  - first changed at {code(info['commit'][:12], False)} {plain(info['subject'])}{pr}")
        elif answer.get("candidates"):
            lines.append(f"{indent}  - {plain(answer['status'])}: " + ", ".join(
                f"{code(c['commit'][:12], False)} {plain(c['subject'])}" for c in answer["candidates"]))
        else:
            lines.append(f"{indent}  - no answer: {plain(answer.get('reason') or '')}")
    return "\n".join(lines) + "\n"


def offers_for(run: dict[str, Any], args: argparse.Namespace, out_dir: Path) -> list[dict[str, Any]]:
    """The offers of a review run; each bisect run too with `--bisect`."""
    found = offers(run, args.base, args.head)
    if getattr(args, "bisect", False):
        run_offers(found, out_dir, args)
    return found
