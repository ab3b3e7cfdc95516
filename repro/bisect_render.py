"""`repro bisect`'s answer (bisect.json's data) as text for the terminal or Markdown for a
pull request: the commit, its subject and pull request, the files it changed under
transformer_engine/, the state before and after, the commands that show each side, the steps."""

from __future__ import annotations

from typing import Any

from harness.runner.textsafe import printable
from repro.render_md import code, fit, plain, table


def _pr(info: dict[str, Any], md: bool) -> str:
    if info.get("pr") is None:
        return ""
    if info.get("pr_link"):
        return f"[#{info['pr']}]({info['pr_link']})" if md else f"PR #{info['pr']} {info['pr_link']}"
    return f"PR #{info['pr']}"


def _commit_lines(info: dict[str, Any], md: bool) -> list[str]:
    files = info["files"] or []
    shown = ", ".join(code(f) if md else f for f in files[:20]) + (f" and {len(files) - 20} more" if len(files) > 20
                                                                     else "")
    subject = plain(info["subject"]) if md else info["subject"]
    head = f"{code(info['commit'][:12]) if md else info['commit']} {subject}"
    pr = _pr(info, md)
    linked = md and info.get("pr_link")  # without a link, the subject names the pull request already
    lines = [head + (f" ({pr})" if linked else ""), *([f"  {pr}"] if pr and not md else [])]
    lines.append(("  " if not md else "") + "changed under transformer_engine/: " + (shown or "nothing"))
    return lines


def _steps(answer: dict[str, Any], md: bool) -> list[str]:
    rows = [[str(i), s["role"], s["commit"][:12], s["state"] + (f" ({s['why']})" if s["why"] else ""),
             s.get("run_dir") or "-"] for i, s in enumerate(answer["steps"], 1)]
    if md:
        return table(["#", "step", "commit", "state", "run dir"],
                     [[r[0], plain(r[1]), code(r[2]), plain(r[3]), code(r[4])] for r in rows])
    return [f"  [{r[0]}] {r[1]} {r[2]}: {r[3]}  ({r[4]})" for r in rows]


def render(answer: dict[str, Any], fmt: str = "text") -> str:
    md = fmt == "md"
    lines = _render(answer, md)
    text = "\n".join(lines).rstrip("\n") + "\n"
    return fit(text) if md else printable(text)


def _render(answer: dict[str, Any], md: bool) -> list[str]:
    ends = (f"good {code(answer['good'], False) if md else answer['good']} → bad "
            f"{code(answer['bad'], False) if md else answer['bad']}: {answer['commits_between']} commits"
            + (f" after their merge base {answer['merge_base'][:12]}" if answer.get("merge_base") else "")
            + (", first-parent chain" if answer.get("first_parent") else "")
            + f"; {answer['judged']} runs, {answer.get('wall_s', '?')} s")
    title = "# repro bisect: " if md else "repro bisect: "
    if answer["status"] == "no answer":
        return [f"{title}no answer", "", ends, "", answer["reason"], "", "Steps:", *_steps(answer, md)]
    lines = [f"{title}{answer['status']}", "", ends, ""]
    if answer["commit"] is not None:
        lines += ["The first commit at which the cases change:" if md else "first commit at which the cases change:",
                  "", *_commit_lines(answer["commit"], md), ""]
    else:
        lines += [(f"One of these {len(answer['candidates'])} commits (the first ones could not be judged; the"
                   " last is the first judged with the change):"), ""]
        for info in answer["candidates"]:
            lines += [("- " if md else "* ") + _commit_lines(info, md)[0], *_commit_lines(info, md)[1:], ""]
    label = "cases compared" if not answer["dropped_cases"] else (
        f"cases compared ({len(answer['dropped_cases'])} left out: not judged at one end)")
    state_rows = [["before", answer["last_good"][:12], "; ".join(answer["before"]), answer["reproduce"]["before"]],
                  ["after", answer["candidates"][-1]["commit"][:12], "; ".join(answer["after"]),
                   answer["reproduce"]["after"]]]
    changed = f"{len(answer['changed_cases'])} of {answer['cases']} {label} changed"
    if md:
        lines += [changed + ".", "", *table(["side", "commit", "state", "reproduce"],
                                            [[r[0], code(r[1]), plain(r[2]), code(r[3])] for r in state_rows]), ""]
    else:
        lines += [changed]
        for side, states in (("before", answer["before"]), ("after", answer["after"])):
            row = state_rows[0 if side == "before" else 1]
            lines += [f"  {side} ({row[1]}): {row[3]}", *(f"    {line}" for line in states)]
        lines.append("")
    if not answer["after_is_bad_end"]:
        lines += ["The state after it is not the bad end's (" + "; ".join(answer["bad_end"]) + "): later commits"
                  " changed these cases again; the next change: " + (code(answer["next"], False) if md else
                                                                     answer["next"]), ""]
    lines += ["Steps:", "", *_steps(answer, md)] if md else ["steps:", *_steps(answer, md)]
    return lines
