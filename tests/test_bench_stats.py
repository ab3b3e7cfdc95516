"""Ratio arithmetic and the noise rule of `repro bench`, on synthetic timings."""

from __future__ import annotations

import pytest

from harness.bench import stats as bs

SPECS = ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0"]


def test_per_round_ratios_pair_rounds_and_drop_missing() -> None:
    assert bs.per_round_ratios([2.0, 3.0, None, 4.0], [1.0, 2.0, 1.0, 0.0]) == [2.0, 1.5]


def test_per_round_ratios_refuse_unequal_rounds() -> None:
    with pytest.raises(ValueError):
        bs.per_round_ratios([1.0, 2.0], [1.0])


def test_summary_is_median_and_min_max_across_rounds() -> None:
    summary = bs.ratio([1.1, 1.3, 1.2, 1.0], [1.0, 1.0, 1.0, 0.5])
    assert summary is not None
    assert summary.per_round == pytest.approx((1.1, 1.3, 1.2, 2.0))
    assert summary.median == pytest.approx(1.25)  # even count: mean of the middle two
    assert (summary.low, summary.high) == pytest.approx((1.1, 2.0))


@pytest.mark.parametrize(("ratios", "call"), [
    ([0.9, 1.1, 1.05], bs.WITHIN_NOISE),   # spread covers 1.0
    ([1.0, 1.2], bs.WITHIN_NOISE),         # touching 1.0 counts as covering it
    ([1.1, 1.2, 1.3], bs.SLOWER),
    ([0.7, 0.8], bs.FASTER),
    ([1.5], bs.TOO_FEW_ROUNDS),            # one round has no spread
])
def test_noise_rule(ratios: list[float], call: str) -> None:
    summary = bs.summarize(ratios)
    assert summary is not None and summary.call == call


def test_no_rounds_gives_no_summary() -> None:
    assert bs.summarize([]) is None
    assert bs.ratio([None, None], [1.0, 1.0]) is None


def test_pairings_find_patched_base_and_upstream() -> None:
    pairs = bs.pairings(SPECS, "te-2.16.0")
    assert pairs[bs.BACKPORT_VS_UNPATCHED] == ("te-2.13.0+backport", "te-2.13.0")
    assert pairs[bs.BACKPORT_VS_UPSTREAM] == ("te-2.13.0+backport", "te-2.16.0")


def test_pairings_without_a_side_are_none() -> None:
    assert bs.pairings(["te-2.13.0+backport", "te-2.16.0"], "te-2.16.0")[bs.BACKPORT_VS_UNPATCHED] is None
    assert bs.pairings(["te-2.13.0", "te-2.16.0"], "te-2.16.0") == {
        bs.BACKPORT_VS_UNPATCHED: None, bs.BACKPORT_VS_UPSTREAM: None}
    assert bs.pairings(SPECS, "te-2.20.2")[bs.BACKPORT_VS_UPSTREAM] is None


def _timings(unpatched: list[float], backport: list[float], upstream: list[float],
             reference: list[float]) -> bs.Timings:
    return {"te-2.13.0": {"fuser": list(unpatched), "reference": list(reference)},
            "te-2.13.0+backport": {"fuser": list(backport), "reference": list(reference)},
            "te-2.16.0": {"fuser": list(upstream), "reference": list(reference)}}


def test_row_ratios_on_synthetic_timings() -> None:
    # Round 2 runs on a machine twice as slow for everyone: per-round ratios cancel it.
    timings = _timings(unpatched=[10e-6, 20e-6, 10e-6], backport=[12e-6, 24e-6, 12e-6],
                       upstream=[11e-6, 20e-6, 10e-6], reference=[5e-6, 10e-6, 5e-6])
    ratios = bs.row_ratios(timings, SPECS, "te-2.16.0")
    unpatched = ratios[bs.BACKPORT_VS_UNPATCHED]
    assert unpatched["median"] == pytest.approx(1.2) and unpatched["min"] == pytest.approx(1.2)
    assert unpatched["call"] == bs.SLOWER
    assert unpatched["numerator"] == "te-2.13.0+backport" and unpatched["denominator"] == "te-2.13.0"
    upstream = ratios[bs.BACKPORT_VS_UPSTREAM]
    assert (upstream["min"], upstream["median"], upstream["max"]) == pytest.approx((12 / 11, 1.2, 1.2))
    assert ratios[bs.FUSER_VS_REFERENCE]["te-2.13.0"]["median"] == pytest.approx(2.0)
    assert ratios[bs.FUSER_VS_REFERENCE]["te-2.13.0+backport"]["median"] == pytest.approx(2.4)


def test_format_ratio_says_within_noise_only_when_it_is() -> None:
    noisy = bs.summarize([0.95, 1.10]).as_dict()  # type: ignore[union-attr]
    clear = bs.summarize([1.20, 1.30]).as_dict()  # type: ignore[union-attr]
    assert bs.format_ratio(noisy) == "1.02 [0.95–1.10] within noise"
    assert bs.format_ratio(clear) == "1.25 [1.20–1.30]"
    assert bs.format_ratio(None) == "n/a"


def _row(median: float, mode: str = "fwd_bwd") -> dict:
    entry = {"numerator": "te-2.13.0+backport", "denominator": "te-2.13.0", "median": median,
             "min": median, "max": median, "per_round": [median, median], "call": "slower"}
    return {"pipeline": "rmsnorm", "dtype": "float32", "device": "cpu", "mode": mode,
            "ratios": {bs.BACKPORT_VS_UNPATCHED: entry}}


def test_slowdowns_use_the_median_against_one_plus_pct() -> None:
    rows = [_row(1.04, "fwd_grad"), _row(1.06, "fwd_bwd"), {**_row(2.0), "ratios": {bs.BACKPORT_VS_UNPATCHED: None}}]
    found = bs.slowdowns(rows, 5)
    assert len(found) == 1 and found[0].startswith("rmsnorm float32 cpu fwd_bwd:")
    assert bs.slowdowns(rows, 10) == []
    assert bs.slowdowns([_row(1.05)], 5) == []  # exactly at the limit is not over it
