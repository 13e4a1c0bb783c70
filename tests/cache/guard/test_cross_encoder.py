"""The cross-encoder: the shipped adapter records the English fit sets, loading folds its
changes into the layers faithfully, serving's prepared form scores as the eager model
(float32: equal; int8: close) and is kept on disk until its sources change, training
learns, and the held-out logits the verifier is fitted on come from the form served. What
it earns on held-back sets is tested beside the verifier it feeds
(tests/bench/test_verifier_fit.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from bench.calibrate import Pair, load_pairs
from bench.cross_encoder_fit import (
    HeldOut,
    adapted_model,
    held_out_logits,
    read_held_out,
    save,
    served_form,
    train,
)
from cache import Embedder, Guard
from cache.guard.cross_encoder import (
    ALONE,
    WEIGHTS,
    CrossEncoder,
    Folded,
    fold,
    logits,
    serving_dtype,
    shared,
)
from cache.guard.pair_features import pair_features
from cache.guard.verifier import Verifier
from tests.cache.fresh_process import in_fresh_process

ROOT = Path(__file__).parents[3]
PAIRS = [
    ("Why did the Roman Empire fall?", "Why did the Roman Empire collapse?"),
    ("How do I keep avocados from turning brown?", "How do I stop avocados turning brown?"),
    ("How do I keep avocados from turning brown?", "How do I ripen avocados quickly?"),
]


def test_the_shipped_adapter_records_the_english_fit_sets():
    fitted = json.loads((ROOT / "cache" / "guard" / "verifier.json").read_text())["fitted_on"]
    assert shared().fitted_on == fitted["english"]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where prepared forms of the tests' own adapters are kept."""
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_loading_folds_each_change_into_its_layer(tmp_path: Path, cache_dir: Path):
    adapted = adapted_model()
    plain = adapted.logits(PAIRS)
    with torch.no_grad():
        for change in adapted.changes.values():
            change.b.normal_(0, 0.02)  # as if trained: B starts at zero
        adapted.head.weight.normal_(0, 0.1)
    adapted.model.eval()
    with torch.inference_mode():
        expected = adapted.logits(PAIRS)
    save(adapted.tensors(), tmp_path / "adapter.safetensors", {"made up": []})
    loaded = CrossEncoder(tmp_path / "adapter.safetensors", "float32")
    try:
        got = loaded.score_many(PAIRS)
        assert got == pytest.approx(expected.tolist(), abs=1e-4)
        assert loaded.fitted_on == ["made up"]
    finally:
        loaded.close()
    # The changes matter: without them the head reads other states.
    assert not torch.allclose(plain, expected, atol=1e-2)


class EagerHoldout(NamedTuple):
    eager: Folded
    pairs: list[tuple[str, str]]
    expected: list[float]  # the eager model's logits of the pairs


@pytest.fixture(scope="module")
def eager_holdout() -> EagerHoldout:
    """The eager model and its logits on the held-out pairs, which each served form is
    held to."""
    eager = fold(WEIGHTS)
    holdout = load_pairs(ROOT / "data" / "cache_pairs_holdout.jsonl")
    pairs = [(p.cached, p.query) for p in holdout]
    return EagerHoldout(eager, pairs, logits(eager.scorer, eager.tokenizer, pairs))


def test_serving_in_float32_scores_as_the_eager_model(eager_holdout: EagerHoldout):
    # The prepared form (traced, frozen, read from disk) against the eager model it was
    # built from, on real pairs: in batches (padded) and one pair at a time.
    eager, pairs, expected = eager_holdout
    served = CrossEncoder(dtype="float32")
    try:
        assert served.score_many(pairs) == pytest.approx(expected, abs=1e-5)
        alone = [logits(eager.scorer, eager.tokenizer, [pair])[0] for pair in pairs[:20]]
        assert [served.score(*pair) for pair in pairs[:20]] == pytest.approx(alone, abs=1e-5)
        assert served.fitted_on == eager.fitted_on
    finally:
        served.close()


def test_serving_in_int8_stays_close_to_the_eager_model(eager_holdout: EagerHoldout):
    # On the held-out pairs: every logit within 0.35 of float32's, the median within 0.05
    # (0.31 and 0.036 measured; the verifier weighs the logit by ~0.4, so 0.35 moves its
    # log-odds by ~0.14 at most). The guard serves this form where the CPU has int8.
    _, pairs, expected = eager_holdout
    served = CrossEncoder(dtype="int8")
    try:
        got = served.score_many(pairs)
    finally:
        served.close()
    moved = [abs(a - b) for a, b in zip(got, expected, strict=True)]
    assert max(moved) < 0.35 and statistics.median(moved) < 0.05
    assert shared().dtype == serving_dtype()


def test_the_prepared_form_is_kept_and_built_again_once_its_adapter_changes(
    tmp_path: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture
):
    adapter = tmp_path / "adapter.safetensors"
    shutil.copy2(WEIGHTS, adapter)
    caplog.set_level(logging.INFO, "cache.guard.cross_encoder")
    built = CrossEncoder(adapter)
    scores = built.score_many(PAIRS)
    built.close()
    assert "building the cross-encoder's prepared form" in caplog.text
    assert len(list((cache_dir / "cross-encoders").glob("*.pt"))) == 1
    # A fresh process loads it, with the same logits and without importing transformers.
    code = (
        "from pathlib import Path\n"
        "from cache.guard.cross_encoder import CrossEncoder\n"
        f"result = CrossEncoder(Path({str(adapter)!r})).score_many({PAIRS!r})\n"
    )
    assert in_fresh_process(code, cache_dir) == {"result": scores, "imported": []}
    # Another adapter file (here, the same bytes touched) is built again, in the entry's place.
    caplog.clear()
    stat = adapter.stat()
    os.utime(adapter, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    rebuilt = CrossEncoder(adapter)
    assert rebuilt.score_many(PAIRS) == scores
    rebuilt.close()
    assert "building the cross-encoder's prepared form" in caplog.text
    assert len(list((cache_dir / "cross-encoders").glob("*.pt"))) == 1


def test_training_learns_the_labels():
    pairs = [Pair(a, b, 1 if i < 2 else 0) for i, (a, b) in enumerate(PAIRS)]
    losses: list[float] = []
    train(pairs, epochs=40, progress=lambda step, steps, loss: losses.append(loss))
    assert len(losses) == 7  # 6 examples (both orders) in one batch a step, 40 passes / 32
    assert losses[-1] < losses[0]


def test_an_adapter_of_another_model_is_refused(tmp_path: Path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"), {"base": "bert"})
    with pytest.raises(ValueError, match="not a cross-encoder adapter"):
        CrossEncoder(tmp_path / "other.safetensors")


def test_held_out_logits_are_read_by_fit_file_and_refused_once_it_changed(tmp_path: Path):
    fitted = {"a.jsonl": [Pair(*PAIRS[0], 1)], "b.jsonl": [Pair(*PAIRS[1], 1), Pair(*PAIRS[2], 0)]}
    path = tmp_path / "adapter.safetensors"
    held_out = HeldOut(torch.tensor([1.0, 2.0, -3.0]), "int8")
    save({"head.bias": torch.zeros(1)}, path, fitted, held_out)
    unseen = [Pair("What is DNA?", "What's DNA?", 1)]
    read = read_held_out(path, {"b.jsonl": fitted["b.jsonl"], "c.jsonl": unseen}, "int8")
    assert read == {"b.jsonl": [2.0, -3.0], "c.jsonl": None}
    edited = {"a.jsonl": [Pair(PAIRS[0][0], PAIRS[0][1], 0)]}
    with pytest.raises(ValueError, match=r"a\.jsonl changed"):
        read_held_out(path, edited, "int8")
    # Logits scored through another form than the one served are refused too.
    with pytest.raises(ValueError, match="scored in int8, but the cross-encoder serves in"):
        read_held_out(path, fitted, "float32")


def test_the_verifier_reads_held_out_logits_of_the_form_served():
    # The shipped adapter's held-out logits were scored in the dtype the guard serves in.
    files = {name: load_pairs(ROOT / name) for name in shared().fitted_on}
    cross = read_held_out(WEIGHTS, files, Guard().cross.dtype)
    assert all(logits is not None for logits in cross.values())


def test_held_out_logits_come_from_the_served_form(cache_dir: Path):
    # Each file scored by its fold's adapter built as CrossEncoder builds it (training is
    # seeded, so a fold trained again is the same model), a pair at a time.
    files = {"a.jsonl": [Pair(*PAIRS[0], 1), Pair(*PAIRS[2], 0)], "b.jsonl": [Pair(*PAIRS[1], 1)]}
    held = held_out_logits(files, folds=2)
    assert held.dtype == serving_dtype()
    expected = []
    for name, other in (("a.jsonl", "b.jsonl"), ("b.jsonl", "a.jsonl")):
        served = served_form(train(files[other]), held.dtype)
        rows = [(p.cached, p.query) for p in files[name]]
        expected += logits(served.module, served.tokenizer, rows, ALONE)
    assert held.logits.tolist() == expected


def test_settled_says_what_every_value_of_the_feature_would():
    verifier = Verifier(("similarity", "cross"), (20.0, 0.5), -14.0, 0.8)
    grid = [x / 4 for x in range(-32, 33)]  # -8 .. 8
    seen = set()
    for similarity in [x / 100 for x in range(50, 101)]:
        answers = {verifier.admits({"similarity": similarity, "cross": x}) for x in grid}
        settled = verifier.settled({"similarity": similarity}, "cross", -8.0, 8.0)
        assert settled == (answers.pop() if len(answers) == 1 else None)
        seen.add(settled)
    assert seen == {True, False, None}


def test_the_guard_runs_the_cross_encoder_only_where_it_can_change_the_answer(
    embedder: Embedder,
):
    # Every decision equals the verifier's with the logit always computed.
    guard = Guard()
    verifier = guard.verifier
    pairs = load_pairs(ROOT / "data" / "cache_pairs_holdout.jsonl")
    skipped = 0
    for p in pairs:
        evidence = guard.evidence(p.cached, p.query)
        if evidence.certain is not None:
            continue
        similarity = float(np.dot(*embedder.embed_many([p.cached, p.query])))
        grey = {v.rule for v in evidence.grey if v.rule}
        logit = guard.cross.score(p.cached, p.query)
        values = pair_features(evidence.a, evidence.b, similarity, grey, logit)
        verdict = guard.check(p.cached, p.query, similarity)
        assert verdict.ok == verifier.admits(values), (p, verdict)
        skipped += "whatever the cross-encoder says" in verdict.detail
    assert skipped > 0
