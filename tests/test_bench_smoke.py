"""`repro bench` end to end on real targets: the output's structure, never timing values
(a shared two-core machine makes those noisy), and the --fail-on-slowdown gate on a
target deliberately slowed by the test-only REPRO_TEST_SLOW_TARGET hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import bench
from harness.bench import stats as bench_stats
from tests.conftest import REPO

THREE = "te-2.13.0,te-2.13.0+backport,te-2.16.0"
CALLS = {bench_stats.WITHIN_NOISE, bench_stats.SLOWER, bench_stats.FASTER}


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (bench.TEST_SLOW_ENV, bench.TEST_SLOW_SECONDS_ENV)}
    return subprocess.run([sys.executable, "-m", "repro", "bench", *args], capture_output=True, text=True,
                          check=False, cwd=REPO, env={**clean, **(env or {})}, timeout=300)


def _check_entry(entry: dict, rounds: int) -> None:
    assert len(entry["per_round"]) == rounds
    assert entry["min"] <= entry["median"] <= entry["max"]
    assert entry["call"] in CALLS


def test_bench_output_structure(tmp_path: Path) -> None:
    # Two modes keep it short (no Megatron import) and still give one excluded
    # combination: te-2.13.0 clears the caller's flag inside a reentrant checkpoint.
    result = _bench("--matrix", "smoke", "--only", "pipeline=fused_residual_rmsnorm,rmsnorm", "--only", "dtype=float32",
                    "--modes", "fwd_no_grad,fwd_bwd_checkpoint_reentrant", "--targets", THREE, "--rounds", "2",
                    "--min-run-time", "0.01", "--fail-on-slowdown", "100000", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert perf["schema"] == "repro.perf/1" and perf["rounds"] == 2 and perf["min_run_time"] == 0.01
    assert [t["spec"] for t in perf["targets"]] == THREE.split(",")
    assert perf["test_slowdown"] is None and perf["problems"] == []
    benched = {(r["pipeline"], r["mode"]) for r in perf["rows"]}
    assert benched == {("fused_residual_rmsnorm", "fwd_no_grad"), ("rmsnorm", "fwd_no_grad"),
                       ("rmsnorm", "fwd_bwd_checkpoint_reentrant")}
    (excluded,) = perf["excluded"]
    assert (excluded["pipeline"], excluded["mode"]) == ("fused_residual_rmsnorm", "fwd_bwd_checkpoint_reentrant")
    assert excluded["reason"].startswith("te-2.13.0: fuser first call changed the caller's input requires_grad")
    assert "backport" not in excluded["reason"] and "te-2.16.0" not in excluded["reason"]
    for row in perf["rows"]:
        assert row["input"] == ("leaf" if row["mode"] == "fwd_no_grad" else "leaf_requires_grad")
        assert row["memory_bytes"] is None  # CPU: left out, and the notes say why
        _check_entry(row["ratios"][bench_stats.BACKPORT_VS_UNPATCHED], 2)
        assert row["ratios"][bench_stats.BACKPORT_VS_UPSTREAM]["denominator"] == "te-2.16.0"
        _check_entry(row["ratios"][bench_stats.BACKPORT_VS_UPSTREAM], 2)
        for spec in THREE.split(","):
            _check_entry(row["ratios"][bench_stats.FUSER_VS_REFERENCE][spec], 2)
            for side in ("fuser", "reference"):
                assert len(row["timings_s"][spec][side]["median_per_round"]) == 2
    assert any(note.startswith("memory: not measured on the CPU") for note in perf["notes"])
    for text in ("+backport / unpatched", "+backport / upstream", "fuser / ref", "excluded (1)",
                 "a plain leaf for fwd_no_grad", "memory: not measured on the CPU"):
        assert text in result.stdout
    assert (tmp_path / "perf.svg").read_text().startswith("<svg")


def test_fail_on_slowdown_names_the_slowed_row(tmp_path: Path) -> None:
    slowed = {bench.TEST_SLOW_ENV: "te-2.13.0+backport", bench.TEST_SLOW_SECONDS_ENV: "0.005"}
    result = _bench("--matrix", "smoke", "--only", "pipeline=rmsnorm", "--only", "dtype=float32", "--modes",
                    "fwd_no_grad", "--targets", "te-2.13.0,te-2.13.0+backport", "--rounds", "2", "--min-run-time",
                    "0.01", "--fail-on-slowdown", "50", "--out", str(tmp_path), env=slowed)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "slowdown over 50.0%: rmsnorm float32 cpu fwd_no_grad: +backport / unpatched median" in result.stderr
    assert "TEST-ONLY SLOWDOWN ACTIVE" in result.stdout
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert perf["test_slowdown"] == {"te-2.13.0+backport": 0.005}
    assert perf["comparisons"][bench_stats.BACKPORT_VS_UPSTREAM] is None  # no upstream target: n/a, not an error


def test_bad_bench_arguments_exit_2(tmp_path: Path) -> None:
    one_round = _bench("--rounds", "1", "--out", str(tmp_path))
    assert one_round.returncode == 2 and "--rounds must be at least 2" in one_round.stderr
    no_pair = _bench("--targets", "te-2.13.0,te-2.16.0", "--fail-on-slowdown", "5", "--out", str(tmp_path))
    assert no_pair.returncode == 2 and "needs a +backport target" in no_pair.stderr


def test_perf_svg_is_inline_and_deterministic() -> None:
    from harness.bench.plot import perf_svg

    entry = {"numerator": "a+backport", "denominator": "a", "median": 1.02, "min": 0.97, "max": 1.08,
             "per_round": [0.97, 1.02, 1.08], "call": bench_stats.WITHIN_NOISE}
    row = {"pipeline": "rmsnorm", "dtype": "float32", "device": "cpu", "mode": "fwd_bwd",
           "ratios": {bench_stats.BACKPORT_VS_UNPATCHED: entry, bench_stats.BACKPORT_VS_UPSTREAM: None,
                      bench_stats.FUSER_VS_REFERENCE: {"a": entry, "a+backport": entry}}}
    perf = {"matrix": "smoke", "rounds": 3, "targets": [{"spec": "a"}, {"spec": "a+backport"}], "rows": [row]}
    svg = perf_svg(perf)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")  # no XML prolog: inlinable in HTML
    assert "<text" in svg and "rmsnorm float32 fwd_bwd" in svg  # labels stay text, not glyph paths
    assert bench_stats.BACKPORT_VS_UPSTREAM not in svg  # a ratio with no data gets no panel
    assert perf_svg(perf) == svg
    assert "<svg" in perf_svg({**perf, "rows": []})


def test_bench_takes_any_regression_with_its_own_targets(tmp_path: Path) -> None:
    """Not only issue 22: another regression's pipelines, on its own default targets, with its
    own patch against its base and its first fixed release as the upstream side."""
    result = _bench("--matrix", "saved_tensors_twice", "--only", "pipeline=rmsnorm", "--only", "dtype=float32",
                    "--modes", "fwd_no_grad", "--shapes", "tiny", "--rounds", "2", "--min-run-time", "0.01",
                    "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert [t["spec"] for t in perf["targets"]] == ["te-2.4.0", "te-2.4.0+saved_tensors_once", "te-2.5.0"]
    (row,) = perf["rows"]
    assert row["pipeline"] == "rmsnorm"
    assert row["ratios"][bench_stats.BACKPORT_VS_UNPATCHED]["denominator"] == "te-2.4.0"
    assert row["ratios"][bench_stats.BACKPORT_VS_UPSTREAM]["denominator"] == "te-2.5.0"
