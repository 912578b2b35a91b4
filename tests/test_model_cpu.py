"""The packed CPU forward pass against Hugging Face transformers and sentence-transformers."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.testing.compare import cos_dist


def write_random_encoder(tmp_path, model_type, pooling, normalize, layers=2, hidden=64, heads=4, seed=0):
    """A random-weight HF folder (config.json, safetensors, tokenizer.json, pooling files)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(seed)
    common = dict(vocab_size=300, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=hidden * 4, max_position_embeddings=130, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    if model_type == "bert":
        cfg = transformers.BertConfig(**common, type_vocab_size=2)
        model = transformers.BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = transformers.XLMRobertaConfig(**common, type_vocab_size=1, pad_token_id=1)
        model = transformers.XLMRobertaModel(cfg, add_pooling_layer=False)
    model.eval()
    with torch.no_grad():        # make LayerNorm and biases non-trivial
        for n, p in model.named_parameters():
            if "LayerNorm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        + ([{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
           if normalize else [])))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
         "pooling_mode_mean_tokens": pooling == "mean"}))
    return model


def hf_reference(model, seqs, pooling, offset):
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            h = model(input_ids=ids).last_hidden_state[0]
            out.append(h[0] if pooling == "cls" else h.mean(0))
    return torch.stack(out).numpy()


@pytest.mark.parametrize("model_type,pooling,normalize", [
    ("bert", "mean", True), ("bert", "cls", False), ("xlm-roberta", "cls", True), ("xlm-roberta", "mean", False)])
def test_random_encoder_matches_transformers(tmp_path, model_type, pooling, normalize):
    hf = write_random_encoder(tmp_path, model_type, pooling, normalize)
    cfg = ModelConfig.from_folder(tmp_path)
    assert (cfg.pooling, cfg.normalize) == (pooling, normalize)
    engine = Engine(cfg)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(2, 300, size=n).tolist() for n in (1, 7, 64, 3, 128, 33)]
    ours = engine.embed(seqs)                                    # one ragged batch
    ref = hf_reference(hf, seqs, pooling, cfg.position_offset)
    if normalize:
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert cos_dist(ours, ref).max() <= 1e-5
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-4)
    # batch composition must not change a sequence's embedding
    alone = np.concatenate([engine.embed([s]) for s in seqs])
    np.testing.assert_allclose(ours, alone, rtol=1e-4, atol=1e-5)


def test_default_model_matches_sentence_transformers(default_model_dir, sentence_model):
    from tokenizers import Tokenizer
    cfg = ModelConfig.from_folder(default_model_dir)
    tok = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(cfg.max_seq_length)
    texts = ["a", "The capital of France is Paris.", "x " * 400, "Grüße aus Köln 🌧️ ☂️"]
    ours = Engine(cfg).embed([e.ids for e in tok.encode_batch(texts)])
    ref = sentence_model.encode(texts)
    assert cos_dist(ours, ref).max() <= 1e-5


def test_config_refuses_pickle_only_folder(tmp_path):
    from rose_backend.config import ModelFolderError
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelFolderError, match="safetensors only"):
        ModelConfig.from_folder(tmp_path)


def test_loader_reports_missing_weights(tmp_path):
    write_random_encoder(tmp_path, "bert", "mean", False)
    from safetensors.torch import load_file
    w = load_file(tmp_path / "model.safetensors")
    w = {k: v for k, v in w.items() if "layer.1.output.dense" not in k}
    save_file(w, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="missing"):
        Engine(ModelConfig.from_folder(tmp_path))
