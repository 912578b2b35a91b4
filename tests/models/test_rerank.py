"""Rerankers without a server: which folders are rerankers, pair tokenization, heads in the engine.

Scores are compared with sentence-transformers' CrossEncoder.predict and the Qwen3-Reranker model
card's code on random-weight folders (rose_testing.reranker_folders), within 1e-4.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rose_backend.config import ModelConfig, ModelFolderError
from rose_testing.reranker_folders import reference_scores, words, write_reranker_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerankers")
    return {name: write_reranker_folder(name, root / name)
            for name in ("tiny-bert-ce", "tiny-xlmr-ce", "tiny-qwen3-reranker")}


def _copy(src, dst, config_update=None, drop=()):
    shutil.copytree(src, dst)
    for f in drop:
        (dst / f).unlink()
    if config_update is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_update)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_kind_detection(folders, tmp_path, default_model_dir, monkeypatch):
    monkeypatch.delenv("ROSE_MODEL_KIND", raising=False)
    assert ModelConfig.from_folder(default_model_dir).kind == "embedding"
    for name, kind in (("tiny-bert-ce", "cross-encoder"), ("tiny-xlmr-ce", "cross-encoder"),
                       ("tiny-qwen3-reranker", "qwen3-reranker")):
        cfg = ModelConfig.from_folder(folders[name])
        assert cfg.kind == kind and cfg.embedding_dim == 1 and cfg.is_reranker
    assert ModelConfig.from_folder(folders["tiny-bert-ce"]).uses_token_types
    assert not ModelConfig.from_folder(folders["tiny-xlmr-ce"]).uses_token_types
    # A Qwen3ForCausalLM folder without a reranker mark stays an embedder ...
    plain = _copy(folders["tiny-qwen3-reranker"], tmp_path / "plain", drop=("README.md",))
    assert ModelConfig.from_folder(plain).kind == "embedding"
    # ... unless sentence-transformers' LogitScore module, vLLM's key, or the deployment says so.
    (plain / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Transformer"},
                                                    {"idx": 1, "name": "1", "path": "1_LogitScore", "type": "sentence_transformers.cross_encoder.modules.LogitScore"}]))
    assert ModelConfig.from_folder(plain).kind == "qwen3-reranker"
    (plain / "modules.json").unlink()
    assert ModelConfig.from_folder(plain, "qwen3-reranker").kind == "qwen3-reranker"
    monkeypatch.setenv("ROSE_MODEL_KIND", "qwen3-reranker")
    assert ModelConfig.from_folder(plain).kind == "qwen3-reranker"
    monkeypatch.setenv("ROSE_MODEL_KIND", "reranker")
    with pytest.raises(ModelFolderError, match="model kind 'reranker' is not one of"):
        ModelConfig.from_folder(plain)
    monkeypatch.delenv("ROSE_MODEL_KIND")
    vllm = _copy(plain, tmp_path / "vllm", {"is_original_qwen3_reranker": True})
    assert ModelConfig.from_folder(vllm).kind == "qwen3-reranker"
    with pytest.raises(ModelFolderError, match="must be a causal qwen3 model"):
        ModelConfig.from_folder(folders["tiny-xlmr-ce"], "qwen3-reranker")


def test_launcher_serves_models_by_kind(folders, default_model_dir, monkeypatch):
    from rose_backend.launch.deployment import MODELS, RERANK_MODELS, served_models
    from rose_backend.launch.triton_install import TritonInstall
    from rose_backend.launch.tritonserver import TritonProcess
    monkeypatch.delenv("ROSE_MODEL_KIND", raising=False)
    assert served_models(None) == MODELS == ("tokenize", "tokenize_batched", "rose", "embed", "encode")
    assert served_models(str(folders["tiny-xlmr-ce"])) == RERANK_MODELS
    cmd = TritonProcess(str(folders["tiny-bert-ce"])).command(TritonInstall(binary="tritonserver", backend_dir=None))
    assert "--model-control-mode=explicit" in cmd and "--load-model=rerank" in cmd and "--load-model=embed" not in cmd


def test_activation_and_labels_from_config(folders, tmp_path):
    """config.json's sentence_transformers.activation_fn is what CrossEncoder applies; one label only."""
    from rose_backend.engine.engine import Engine
    from rose_ensemble.pair_tokenization import PairTokenizer
    ident = _copy(folders["tiny-xlmr-ce"], tmp_path / "ident",
                  {"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}})
    cfg = ModelConfig.from_folder(ident)
    assert cfg.score_activation == "identity"
    rng = np.random.default_rng(0)
    query, docs = words(rng, 4), [words(rng, n) for n in (3, 30, 0)]
    ids, lens, types = PairTokenizer.from_folder(ident).encode(query, docs)
    cu = np.concatenate([[0], np.cumsum(lens)])
    got = Engine(cfg).embed([ids[a:b] for a, b in zip(cu[:-1], cu[1:])])[:, 0]
    ref = reference_scores(ident, query, docs)
    assert (ref < 0).any() or (ref > 1).any()              # logits, not probabilities
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    two = _copy(folders["tiny-xlmr-ce"], tmp_path / "two", {"num_labels": 2, "id2label": {"0": "a", "1": "b"}})
    with pytest.raises(ModelFolderError, match="2 labels is not a reranker"):
        ModelConfig.from_folder(two)


@pytest.mark.parametrize("q_len,d_len", [(5, 300), (100, 60), (90, 90), (5, 0)])
def test_bert_pairs_truncate_like_the_hf_tokenizer(folders, q_len, d_len):
    """longest_first, as CrossEncoder tokenizes: ids and segment ids equal transformers' own."""
    from transformers import AutoTokenizer
    from rose_ensemble.pair_tokenization import PairTokenizer
    folder = folders["tiny-bert-ce"]
    hf = AutoTokenizer.from_pretrained(str(folder))
    ours = PairTokenizer.from_folder(folder)
    rng = np.random.default_rng(q_len + d_len)
    vocab = "rose server flower garden red blue river city".split()
    query, doc = (" ".join(rng.choice(vocab, size=n)) for n in (q_len, d_len))
    ids, lens, types = ours.encode(query, [doc])
    # batched, as CrossEncoder calls it (a lone text_pair "" would count as no pair at all)
    ref = hf([query], [doc], truncation=True, max_length=ours.texts.max_seq_length)
    assert ids.tolist() == ref["input_ids"][0] and types.tolist() == ref["token_type_ids"][0]


def test_over_long_query_is_refused(folders):
    from rose_ensemble.pair_tokenization import PairTokenizer
    from rose_ensemble.tokenization import InputError
    rng = np.random.default_rng(0)
    for name in ("tiny-xlmr-ce", "tiny-qwen3-reranker"):
        tok = PairTokenizer.from_folder(folders[name])
        tok.encode(words(rng, 60), ["w9 w10"])                # fits: no error
        with pytest.raises(InputError, match="the query is too long"):
            tok.encode(words(rng, 400), ["w9 w10"])


@pytest.mark.parametrize("tied", [True, False])
def test_qwen3_reranker_static_path_and_untied_head(folders, tmp_path, tied):
    """The bucketed static-buffer path (what CUDA graphs replay) gives the card's p(yes), with the
    lm_head rows read from the tied embeddings or from lm_head.weight."""
    from safetensors.torch import load_file, save_file
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_ensemble.pair_tokenization import PairTokenizer
    folder = folders["tiny-qwen3-reranker"]
    if not tied:
        folder = _copy(folder, tmp_path / "untied", {"tie_word_embeddings": False})
        state = load_file(str(folder / "model.safetensors"))
        state["lm_head.weight"] = state["model.embed_tokens.weight"].flip(0).contiguous()   # distinct rows
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    rng = np.random.default_rng(7)
    query, docs = words(rng, 5), [words(rng, n) for n in (0, 12, 70, 3)]
    ids, lens, _ = PairTokenizer.from_folder(folder).encode(query, docs)
    cu = np.concatenate([[0], np.cumsum(lens)])
    engine = Engine(ModelConfig.from_folder(folder), options=EngineOptions(graphs=True, max_tokens=1024, max_seqs=8))
    got = engine.embed([ids[a:b] for a, b in zip(cu[:-1], cu[1:])])[:, 0]
    assert engine.last_key is not None
    np.testing.assert_allclose(got, reference_scores(folder, query, docs), atol=1e-4, rtol=0)


def test_bert_segment_ids_on_the_static_path(folders):
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_ensemble.pair_tokenization import PairTokenizer
    folder = folders["tiny-bert-ce"]
    query, docs = "red rose garden", ["a blue river city", "", "flower " * 200]
    ids, lens, types = PairTokenizer.from_folder(folder).encode(query, docs)
    cu = np.concatenate([[0], np.cumsum(lens)])
    split = [(ids[a:b], types[a:b]) for a, b in zip(cu[:-1], cu[1:])]
    engine = Engine(ModelConfig.from_folder(folder), options=EngineOptions(graphs=True, max_tokens=1024, max_seqs=8))
    ref = reference_scores(folder, query, docs)
    got = engine.embed([i for i, _ in split], [t for _, t in split])[:, 0]
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    lone = engine.embed([split[0][0]], [split[0][1]])[:, 0]          # one sequence: its own staging path
    np.testing.assert_allclose(lone, ref[:1], atol=1e-4, rtol=0)
