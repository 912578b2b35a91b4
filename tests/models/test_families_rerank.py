"""Cross-encoders of the native encoder families (MPNet, DistilBERT, ModernBERT sequence-classification
heads: models/heads.py) against sentence-transformers' CrossEncoder.predict on random-weight folders
(rose_testing.reranker_folders), pairs tokenized by the server's own pair tokenizer; and the
classification heads no native file serves, refused by name."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rose_backend.config import ModelConfig, ModelFolderError
from rose_backend.engine.engine import Engine
from rose_testing.reranker_folders import reference_scores, words, write_reranker_folder


@pytest.fixture(scope="module")
def folder_of(tmp_path_factory):
    cache = {}

    def make(name):
        if name not in cache:
            cache[name] = write_reranker_folder(name, tmp_path_factory.mktemp(name) / "model")
        return cache[name]
    return make


@pytest.mark.parametrize("name, changes, pooling", [
    ("tiny-mpnet-ce", {}, "cls"), ("tiny-distilbert-ce", {}, "cls"), ("tiny-modernbert-ce", {}, "cls"),
    ("tiny-modernbert-ce", {"classifier_pooling": "mean"}, "mean")])
def test_cross_encoder_scores_match_sentence_transformers(folder_of, tmp_path, name, changes, pooling):
    from rose_ensemble.pair_tokenization import PairTokenizer
    folder = folder_of(name)
    if changes:
        folder = shutil.copytree(folder, tmp_path / "changed")
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, **changes}))
    cfg = ModelConfig.from_folder(folder)
    assert (cfg.kind, cfg.pooling, cfg.embedding_dim) == ("cross-encoder", pooling, 1)
    rng = np.random.default_rng(3)
    query, docs = words(rng, 5), [words(rng, n) for n in (1, 9, 60, 0, 30, 400)]    # the last one cut
    ids, lens, _ = PairTokenizer.from_folder(folder).encode(query, docs)
    cu = np.concatenate([[0], np.cumsum(lens)])
    got = Engine(cfg).embed([ids[a:b].tolist() for a, b in zip(cu[:-1], cu[1:])])[:, 0]
    ref = reference_scores(folder, query, docs)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert np.ptp(ref) > 1e-3                                   # the scores tell documents apart


def test_a_decoder_classification_head_is_refused(folder_of, tmp_path):
    from rose_backend.models.registry import native_family
    folder = shutil.copytree(folder_of("tiny-mpnet-ce"), tmp_path / "qwen2")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1,
        "vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 48}))
    with pytest.raises(ModelFolderError, match="'qwen2' classification head is not"):
        ModelConfig.from_folder(folder)
    assert native_family("qwen2", ["Qwen2ForSequenceClassification"]) is None
    assert native_family("mpnet", ["MPNetForSequenceClassification"]) == "mpnet"
