"""`perf_svg`: the bench ratios as an inline SVG (matplotlib, no pyplot, no network).

One panel per ratio kind; a row per pipeline × dtype × mode; the marker is the median
across rounds and the bar its min–max spread, so "within noise" is visible as a bar
crossing the dashed 1.0 line. Text stays text (svg.fonttype none), and the output is
deterministic (fixed hash salt, no date), so a committed report does not churn.
"""

from __future__ import annotations

import io
import re
from typing import Any

from harness.bench.stats import BACKPORT_VS_UNPATCHED, BACKPORT_VS_UPSTREAM, FUSER_VS_REFERENCE


def _series(perf: dict[str, Any]) -> list[tuple[str, list[tuple[str, dict[str, Any] | None]]]]:
    """(panel title, [(series label, entry per row)]) for the panels that have data."""
    panels: list[tuple[str, list[tuple[str, dict[str, Any] | None]]]] = []
    for label in (BACKPORT_VS_UNPATCHED, BACKPORT_VS_UPSTREAM):
        entries = [row["ratios"].get(label) for row in perf["rows"]]
        if any(entries):
            panels.append((label, [(label, e) for e in entries]))  # type: ignore[misc]
    specs = [t["spec"] for t in perf.get("targets", [])]
    series = [(spec, [row["ratios"][FUSER_VS_REFERENCE].get(spec) for row in perf["rows"]]) for spec in specs]
    if any(e for _, entries in series for e in entries):
        panels.append((FUSER_VS_REFERENCE, [(s, e) for s, entries in series for e in entries]))
    return panels


def perf_svg(perf: dict[str, Any]) -> str:
    """The figure as SVG text without the XML prolog, ready to inline in HTML."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    rows = perf["rows"]
    labels = [f"{r['pipeline']} {r['dtype']} {r['mode']}" for r in rows]
    panels = _series(perf)
    # Fixed hash salt and no date: the same perf gives the same SVG.
    with rc_context({"svg.hashsalt": "repro-perf", "svg.fonttype": "none"}):
        figure = Figure(figsize=(4.2 * max(1, len(panels)) + 3.5, 0.9 + 0.28 * max(1, len(rows))))
        axes = figure.subplots(1, max(1, len(panels)), sharey=True, squeeze=False)[0]
        positions = list(range(len(rows)))
        for ax, (title, flat) in zip(axes, panels):
            names = list(dict.fromkeys(name for name, _ in flat))
            offset_step = 0.6 / max(1, len(names))
            for k, name in enumerate(names):
                entries = [e for n, e in flat if n == name]
                ys = [p - 0.3 + offset_step * (k + 0.5) for p, e in zip(positions, entries) if e]
                med = [e["median"] for e in entries if e]
                low = [e["median"] - e["min"] for e in entries if e]
                high = [e["max"] - e["median"] for e in entries if e]
                ax.errorbar(med, ys, xerr=[low, high], fmt="o", markersize=3.5, capsize=2, label=name)
            ax.axvline(1.0, color="0.4", linestyle="--", linewidth=0.8)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("ratio (median, min–max across rounds)", fontsize=8)
            ax.tick_params(labelsize=7)
            if len(names) > 1:
                ax.legend(fontsize=7, loc="best")
        axes[0].set_yticks(positions, labels)
        axes[0].invert_yaxis()
        if not panels:
            axes[0].text(0.5, 0.5, "no benched rows", ha="center", va="center", transform=axes[0].transAxes)
        figure.suptitle(f"repro bench: {perf.get('matrix', '')}, {perf['rounds']} rounds", fontsize=10)
        figure.tight_layout()
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return re.sub(r"\A.*?(?=<svg)", "", text, flags=re.DOTALL)
