"""Ratio arithmetic for `repro bench`: per-round ratios, their median and spread, the
noise rule and the slowdown gate. Pure functions on numbers (no torch, no processes),
so they are unit-tested on synthetic timings.

Why per-round ratios: within one round the two targets are timed moments apart, so slow
drift of a shared machine (another job, thermal state) cancels in the ratio; the spread
of the per-round ratios across rounds is then an honest measure of what noise remains.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

BACKPORT_VS_UNPATCHED = "+backport / unpatched"
BACKPORT_VS_UPSTREAM = "+backport / upstream"
FUSER_VS_REFERENCE = "fuser / unfused reference"
WITHIN_NOISE = "within noise"
SLOWER = "slower"
FASTER = "faster"
TOO_FEW_ROUNDS = "too few rounds"


@dataclass(frozen=True)
class RatioSummary:
    """Median of the per-round ratios, and their spread as min–max across rounds (with
    a handful of rounds an IQR would rest on two or three points)."""

    median: float
    low: float
    high: float
    per_round: tuple[float, ...]

    @property
    def call(self) -> str:
        return noise_call(self)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "per_round": list(self.per_round),
                "call": self.call}


def per_round_ratios(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> list[float]:
    """numerator[i] / denominator[i] for each round where both were measured. A round
    with a missing or zero time is dropped, never guessed."""
    return [n / d for n, d in zip(numerator, denominator, strict=True) if n is not None and d is not None and d > 0]


def summarize(ratios: Sequence[float]) -> RatioSummary | None:
    if not ratios:
        return None
    return RatioSummary(statistics.median(ratios), min(ratios), max(ratios), tuple(ratios))


def noise_call(summary: RatioSummary) -> str:
    """The noise rule: a ratio whose spread covers 1.0 is within noise. One round has no
    spread, so it is not judged either way."""
    if len(summary.per_round) < 2:
        return TOO_FEW_ROUNDS
    if summary.low <= 1.0 <= summary.high:
        return WITHIN_NOISE
    return SLOWER if summary.median > 1.0 else FASTER


def ratio(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> RatioSummary | None:
    return summarize(per_round_ratios(numerator, denominator))


def base_of(spec: str) -> str | None:
    """The unpatched spec behind `X+patch`, or None for an unpatched spec."""
    head, sep, _ = spec.rpartition("+")
    return head if sep and head else None


def pairings(specs: Sequence[str], upstream: str | None) -> dict[str, tuple[str, str] | None]:
    """(numerator, denominator) for the two cross-target ratios, or None where the
    targets lack one side. The patched target is the first `+backport` spec (else the
    first patched one); its unpatched side is its own base spec."""
    patched = next((s for s in specs if s.endswith("+backport")), None) or next(
        (s for s in specs if base_of(s)), None)
    base = base_of(patched) if patched else None
    pairs: dict[str, tuple[str, str] | None] = {BACKPORT_VS_UNPATCHED: None, BACKPORT_VS_UPSTREAM: None}
    if patched and base and base in specs:
        pairs[BACKPORT_VS_UNPATCHED] = (patched, base)
    if patched and upstream and upstream in specs and upstream != base:
        pairs[BACKPORT_VS_UPSTREAM] = (patched, upstream)
    return pairs


Timings = dict[str, dict[str, list[float | None]]]  # spec -> "fuser" | "reference" -> median per round


def row_ratios(timings: Timings, specs: Sequence[str], upstream: str | None) -> dict[str, Any]:
    """The ratios of one row, as stored in perf.json."""
    out: dict[str, Any] = {}
    for label, pair in pairings(specs, upstream).items():
        summary = ratio(timings[pair[0]]["fuser"], timings[pair[1]]["fuser"]) if pair else None
        out[label] = None if summary is None or pair is None else {
            "numerator": pair[0], "denominator": pair[1], **summary.as_dict()}
    fuser_vs_reference: dict[str, Any] = {}
    for spec in specs:
        summary = ratio(timings[spec]["fuser"], timings[spec]["reference"])
        fuser_vs_reference[spec] = None if summary is None else summary.as_dict()
    out[FUSER_VS_REFERENCE] = fuser_vs_reference
    return out


def format_ratio(entry: dict[str, Any] | None) -> str:
    """A table cell: median [min–max], with the noise call when it is not a clear
    direction (a clear one reads off the median itself)."""
    if entry is None:
        return "n/a"
    text = f"{entry['median']:.2f} [{entry['min']:.2f}–{entry['max']:.2f}]"
    return text if entry["call"] in (SLOWER, FASTER) else f"{text} {entry['call']}"


def row_name(row: dict[str, Any]) -> str:
    return " ".join(str(row[k]) for k in ("pipeline", "dtype", "device", "mode")) + (
        f" {row['shape']}" if row.get("shape", "tiny") != "tiny" else "")


def slowdowns(rows: Iterable[dict[str, Any]], pct: float) -> list[str]:
    """Rows whose `+backport / unpatched` median exceeds 1 + pct/100, as messages. The
    median alone decides, as documented for --fail-on-slowdown; the noise call does not."""
    limit = 1.0 + pct / 100.0
    found = []
    for row in rows:
        entry = row["ratios"].get(BACKPORT_VS_UNPATCHED)
        if entry is not None and entry["median"] > limit:
            found.append(f"{row_name(row)}: {BACKPORT_VS_UNPATCHED} median {entry['median']:.3f} > {limit:.3f} "
                         f"({entry['numerator']} vs {entry['denominator']})")
    return found
