"""What `repro run` shows while it runs, and the one status line it ends with.

On a terminal: one live line per target (rich), with done/total, elapsed time, ETA and
counters by verdict, the counters last and cut first when the terminal is narrow; a start-up
message once the targets are prepared, until the first result arrives. Off a terminal (CI
logs): one short line for the whole run (done/total, percentage, elapsed, ETA, the results
that need a look) at most every `interval_s` seconds, and a last one at the end.
The status line is PASS or FAIL in colour (never with NO_COLOR set, or off a terminal),
each regression's headline, the counts that matter, elapsed time and the report paths.

The runner calls `Progress(totals, tty)` once (totals may be empty when the plan is made
later), `progress(line)` for a message, `progress.update(spec, done, verdict_counts, total)`
whenever it has read new results (a spec not seen before gets its line then), and
`progress.close()`; then `print_status_line(run, paths)`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.progress import ProgressColumn, Task
from rich.table import Column
from rich.text import Text

from repro import reports

# Counters shown live when not zero, after the verdicts that need a person: a narrow terminal cuts
# the counters from the end, and those must stay.
LIVE_VERDICTS = ("reproduced", "fixed", "unaffected", "known_bug", "not_applicable")
STYLES = {"regression": "bold red", "other_failure": "bold red", "unexpected_pass": "bold magenta",
          "harness_error": "bold red", "not_judged": "bold red", "known_bug": "yellow", "reproduced": "blue", "fixed": "green", "unaffected": "dim"}


def no_color() -> bool:
    """https://no-color.org: any non-empty NO_COLOR turns colour off."""
    return bool(os.environ.get("NO_COLOR"))


def verdict_text(counts: Mapping[str, int], markup: bool) -> str:
    parts = []
    for verdict in (*reports.BAD_VERDICTS, *LIVE_VERDICTS):
        n = counts.get(verdict, 0)
        if not n:
            continue
        text = f"{n} {verdict}"
        parts.append(f"[{STYLES[verdict]}]{text}[/]" if markup and verdict in STYLES else text)
    return ", ".join(parts) or "no result yet"


PLAIN_LINE_MAX = 120  # a CI log line read whole, without scrolling sideways
SPEC_MAX = 28  # a target's name on its live line: its start cut beyond this
COUNTERS_ROOM = 30  # kept for the verdict counters before the bar shrinks


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _clock(seconds: float | None) -> str:
    """m:ss, h:mm:ss from an hour: short, so that a narrow terminal keeps the counters."""
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:d}:{secs:02d}"


def _spec_label(spec: str) -> str:
    """The spec, its end kept when long: the revision and the patch tell two targets apart."""
    return spec if len(spec) <= SPEC_MAX else "…" + spec[-(SPEC_MAX - 1):]


class TargetLine(ProgressColumn):
    """A target's whole live line as one text fitted to the terminal's width: the bar shrinks
    first (20 to 4 cells), then the verdict counters are cut from the end; the name, done/total,
    elapsed and ETA stay. Rich's separate columns, on a line too wide, shrank the middle ones
    away: at 80 columns the bar, done/total and ETA vanished."""

    def __init__(self, console: Console) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.console = console
        self.label_width = self.count_width = 0  # the widest of all targets: their lines line up

    def add(self, spec: str, total: int) -> None:
        self.label_width = max(self.label_width, len(_spec_label(spec)))
        self.count_width = max(self.count_width, len(str(total)))

    def render(self, task: Task) -> Text:
        total, done = int(task.total or 0), int(task.completed)
        head = Text(_spec_label(task.description).ljust(self.label_width) + " ")
        tail = Text.assemble((f"{done:>{self.count_width}}/{total:<{self.count_width}}", "progress.download"), " ",
                             (_clock(task.elapsed), "progress.elapsed"), " ETA ",
                             (_clock(task.time_remaining), "progress.remaining"), " ")
        width = self.console.width
        # the same on every line (counters aside), so the columns line up
        bar_width = max(4, min(20, width - head.cell_len - tail.cell_len - 1 - COUNTERS_ROOM))
        filled = min(bar_width, round(bar_width * done / total)) if total else 0
        bar_style = "bar.finished" if total and done >= total else "bar.complete"
        line = Text.assemble(head, ("━" * filled, bar_style), ("━" * (bar_width - filled), "bar.back"), " ", tail,
                             Text.from_markup(task.fields.get("verdicts", "")), no_wrap=True, overflow="ellipsis")
        line.truncate(width, overflow="ellipsis")
        return line


class Progress:
    """Progress of a run's target sessions; see the module docstring."""

    def __init__(self, totals: dict[str, int] | None = None, tty: bool | None = None, stream: TextIO | None = None,
                 interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        totals = dict(totals or {})
        self.totals, self.interval_s, self.clock = totals, interval_s, clock
        self.done: dict[str, int] = dict.fromkeys(totals, 0)
        self.verdicts: dict[str, dict[str, int]] = {spec: {} for spec in totals}
        self.started = clock()
        self.last_line = -float("inf")
        self.any_result = False
        self.first_result: tuple[float, int] | None = None  # (when, done then): the ETA's rate starts there
        self.live: RichProgress | None = None
        self.line: TargetLine | None = None
        self.tasks: dict[str, Any] = {}
        if self.tty:
            console = Console(file=self.stream, force_terminal=True, no_color=no_color(), highlight=False)
            self.line = TargetLine(console)
            self.live = RichProgress(self.line, console=console, transient=False)
            for spec, total in totals.items():
                self._set_total(spec, total)
        self.started_sessions = False

    def _start(self) -> None:
        """On the first message: the runner has prepared the targets (a refusal there is the only
        line a refused run prints) and starts their sessions now."""
        if self.started_sessions:
            return
        self.started_sessions = True
        if self.live is not None:
            self.live.start()
        self("starting the target sessions (importing torch and each target takes a few seconds)…")

    def _set_total(self, spec: str, total: int) -> None:
        """A target's total; its line appears on the first one."""
        self.totals[spec] = total
        self.done.setdefault(spec, 0)
        self.verdicts.setdefault(spec, {})
        if self.live is None or self.line is None:
            return
        self.line.add(spec, total)
        if spec in self.tasks:
            self.live.update(self.tasks[spec], total=total)
        else:
            self.tasks[spec] = self.live.add_task(spec, total=total, verdicts="starting…")

    def __call__(self, line: str) -> None:
        """A message: above the live lines on a terminal, a plain line otherwise."""
        self._start()
        if self.live is not None:
            self.live.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def update(self, spec: str, done: int, verdict_counts: Mapping[str, int], total: int | None = None) -> None:
        self._start()
        if spec not in self.totals or (total is not None and total != self.totals[spec]):
            self._set_total(spec, total if total is not None else 0)
        self.done[spec] = done
        self.verdicts[spec] = dict(verdict_counts)
        self.any_result = self.any_result or done > 0
        if self.any_result and self.first_result is None:
            self.first_result = (self.clock(), sum(self.done.values()))
        if self.live is not None:
            self.live.update(self.tasks[spec], completed=done,
                             verdicts=verdict_text(verdict_counts, markup=True) if done else "starting…")
            return
        now = self.clock()
        if now - self.last_line >= self.interval_s and self.any_result:
            self.last_line = now
            self._plain_line()

    def plain_line(self, final: bool = False) -> str:
        """The whole run in one short line: a CI log gets one every interval_s, not one per target."""
        now = self.clock()
        done, total = sum(self.done.values()), sum(self.totals.values())
        look = sum(n for counts in self.verdicts.values() for verdict, n in counts.items()
                   if verdict in reports.BAD_VERDICTS)
        parts = [f"{done}/{total} results" + (f" ({100 * done // total}%)" if total else "")]
        if not final:
            parts.append(f"ETA {self._eta(now, done, total)}")
        parts.append(f"{look} need{'s' if look == 1 else ''} a look")
        line = f"[{_elapsed(now - self.started)}] " + ", ".join(parts)
        return line if len(line) <= PLAIN_LINE_MAX else line[:PLAIN_LINE_MAX - 1] + "…"

    def _eta(self, now: float, done: int, total: int) -> str:
        """From the rate since the first result: the sessions' start-up is no result's cost."""
        if self.first_result is None or done >= total:
            return "0s" if total and done >= total else "?"
        since, done_then = self.first_result
        if now <= since or done <= done_then:
            return "?"
        return _elapsed((total - done) * (now - since) / (done - done_then))

    def _plain_line(self, final: bool = False) -> None:
        print(self.plain_line(final), file=self.stream, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        elif self.any_result:
            self._plain_line(final=True)


def status_line(run: dict[str, Any], paths: Mapping[str, str] | None = None) -> str:
    """One line: PASS/FAIL, the headlines, the counts that matter, elapsed, the report paths."""
    summary = reports.summarize(run)
    parts = [summary["status"]]
    said = [f"{reg}: {'; '.join(lines)}" for reg, lines in reports.headlines(run).items() if lines]
    parts += said
    counts = ", ".join(f"{n} {v}" for v, n in summary["verdicts"].items() if v not in reports.BAD_VERDICTS)
    parts.append(f"{summary['needs_attention']} need a look" + (f" ({', '.join(summary['fail_reasons'])})"
                                                              if summary["fail_reasons"] else "")
                 + (f"; {counts}" if counts else ""))
    trees = [f"{t['spec']}: {t.get('version', '?')}, {text}" for t in run["environment"]["targets"]
             if (text := reports.provenance_text(t))]
    if trees:
        parts.append("; ".join(trees))
    if isinstance(summary.get("elapsed_s"), (int, float)):
        parts.append(_elapsed(summary["elapsed_s"]))
    if paths:
        parts.append("reports: " + ", ".join(paths.values()))
    return " | ".join(parts)


def print_status_line(run: dict[str, Any], paths: Mapping[str, str] | None = None, stream: TextIO | None = None,
                      ) -> None:
    """The status line, PASS in green or FAIL in red on a terminal without NO_COLOR."""
    stream = stream or sys.stdout
    line = status_line(run, paths)
    status, _, rest = line.partition(" | ")
    if no_color():  # no colour, and no bold either: plain text
        print(f" {status}  {rest}", file=stream)
        return
    console = Console(file=stream, force_terminal=stream.isatty(), highlight=False, soft_wrap=True)
    style = "bold white on green" if status == "PASS" else "bold white on red"
    console.print(f"[{style}] {status} [/] " + rest.replace("[", "\\["))
