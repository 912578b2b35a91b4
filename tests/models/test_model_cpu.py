"""The packed CPU forward pass against Hugging Face transformers and sentence-transformers."""
import json

import numpy as np
import pytest
from safetensors.torch import save_file

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder, random_ids
from rose_testing.reference import Reference

SHAPE = {"bert": "tiny-bert", "xlm-roberta": "tiny-xlm-roberta"}


@pytest.mark.parametrize("model_type,pooling,normalize", [
    ("bert", "mean", True), ("bert", "cls", False), ("xlm-roberta", "cls", True), ("xlm-roberta", "mean", False)])
def test_random_encoder_matches_transformers(tmp_path, model_type, pooling, normalize):
    folder = make_folder(SHAPE[model_type], tmp_path / "m", pooling=pooling, normalize=normalize)
    cfg = ModelConfig.from_folder(folder)
    assert (cfg.pooling, cfg.normalize) == (pooling, normalize)
    engine = Engine(cfg)
    rng = np.random.default_rng(1)
    seqs = [random_ids(rng, cfg.vocab_size, n).tolist() for n in (1, 7, 64, 3, 128, 33, cfg.max_seq_length)]
    ours = engine.embed(seqs)                                    # one ragged batch
    ref = Reference(folder).embed(seqs)                          # HF float32, one sequence at a time
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert cos_dist(ours, ref).max() <= 1e-5
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-4)
    # batch composition must not change a sequence's embedding
    alone = np.concatenate([engine.embed([s]) for s in seqs])
    np.testing.assert_allclose(ours, alone, rtol=1e-4, atol=1e-5)


def test_default_model_matches_sentence_transformers(default_model_dir, shipped_sentence_model):
    from tokenizers import Tokenizer
    cfg = ModelConfig.from_folder(default_model_dir)
    tok = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(cfg.max_seq_length)
    texts = ["a", "The capital of France is Paris.", "x " * 400, "Grüße aus Köln 🌧️ ☂️"]
    ours = Engine(cfg).embed([e.ids for e in tok.encode_batch(texts)])
    ref = shipped_sentence_model.encode(texts)
    assert cos_dist(ours, ref).max() <= 1e-5


def test_config_refuses_pickle_only_folder(tmp_path):
    from rose_backend.config import ModelFolderError
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelFolderError, match="safetensors only"):
        ModelConfig.from_folder(tmp_path)


def test_loader_reports_missing_weights(tmp_path):
    make_folder("tiny-bert", tmp_path)
    from safetensors.torch import load_file
    w = load_file(tmp_path / "model.safetensors")
    w = {k: v for k, v in w.items() if "layer.1.output.dense" not in k}
    save_file(w, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="missing"):
        Engine(ModelConfig.from_folder(tmp_path))
