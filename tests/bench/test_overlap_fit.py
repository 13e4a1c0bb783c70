"""Fitting the overlap bar: the shipped bar is what the labelled sets give, and it
earns its place on files it was not fitted on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.calibrate import load_pairs
from bench.overlap_fit import MeasuredPair, bar_file, fit_bar, held_out, measure
from cache import DEFAULT_THRESHOLD, Embedder, Guard
from cache.overlap import DEFAULT_BAR, DEFAULT_TARGET_PRECISION, OverlapBar, read_bar

ROOT = Path(__file__).parents[2]
DATA = ROOT / "data"


@pytest.fixture(scope="module")
def measured(embedder: Embedder) -> dict[str, list[MeasuredPair]]:
    guard = Guard()
    return {
        path.stem: measure(load_pairs(path), embedder, guard)
        for path in sorted(DATA.glob("cache_pairs*.jsonl"))
    }


def test_the_shipped_bar_is_the_fit_of_the_labelled_sets(measured: dict[str, list[MeasuredPair]]):
    rows = [r for rs in measured.values() for r in rs]
    bar = fit_bar(rows, floor=DEFAULT_THRESHOLD, target_precision=DEFAULT_TARGET_PRECISION)
    assert bar.base == pytest.approx(DEFAULT_BAR.base, abs=0.01)
    assert bar.per_jaccard == pytest.approx(DEFAULT_BAR.per_jaccard, abs=0.01)
    assert bar.per_sequence == pytest.approx(DEFAULT_BAR.per_sequence, abs=0.01)
    assert bar.ceiling == DEFAULT_BAR.ceiling


def test_the_shipped_bar_file_records_the_fit_refitted_above():
    fitted_on = json.loads((ROOT / "cache" / "overlap_bar.json").read_text())["fitted_on"]
    assert fitted_on["floor"] == DEFAULT_THRESHOLD
    assert fitted_on["target_precision"] == DEFAULT_TARGET_PRECISION
    labelled = {str(path.relative_to(ROOT)) for path in DATA.glob("cache_pairs*.jsonl")}
    assert set(fitted_on["pairs"]) == labelled


def test_a_written_bar_reads_back():
    bar = OverlapBar(base=0.4, per_jaccard=0.1, per_sequence=0.7, ceiling=0.9)
    text = bar_file(bar, floor=0.6, target_precision=0.98, pairs=["data/a.jsonl"])
    assert read_bar(text) == bar
    assert json.loads(text)["fitted_on"] == {
        "pairs": ["data/a.jsonl"],
        "floor": 0.6,
        "target_precision": 0.98,
    }


def test_held_out_files_gain_precision_and_keep_recall(measured: dict[str, list[MeasuredPair]]):
    scores = held_out(measured, floor=DEFAULT_THRESHOLD, target_precision=DEFAULT_TARGET_PRECISION)
    assert len(scores) == len(measured)
    paraphrases = {name: sum(r.label for r in rows) for name, rows in measured.items()}

    def pooled(with_bar: bool) -> tuple[float, float]:
        correct = wrong = 0.0
        for s in scores:
            score = s.with_bar if with_bar else s.without_bar
            correct += score.recall * paraphrases[s.name]
            wrong += score.false_hits
        return correct / (correct + wrong), correct / sum(paraphrases.values())

    (p_without, _), (p_with, r_with) = pooled(False), pooled(True)
    assert p_with > p_without + 0.1
    assert p_with >= 0.95 and r_with >= 0.7


def test_an_unreachable_target_is_refused_readably(measured: dict[str, list[MeasuredPair]]):
    rows = [r for rs in measured.values() for r in rs]
    with pytest.raises(ValueError, match=r"no cut of these pairs reaches precision 1\.5"):
        fit_bar(rows, floor=DEFAULT_THRESHOLD, target_precision=1.5)


def test_fitting_needs_both_labels(measured: dict[str, list[MeasuredPair]]):
    only_paraphrases = [r for rs in measured.values() for r in rs if r.label == 1]
    with pytest.raises(ValueError, match="both labels"):
        fit_bar(
            only_paraphrases, floor=DEFAULT_THRESHOLD, target_precision=DEFAULT_TARGET_PRECISION
        )
