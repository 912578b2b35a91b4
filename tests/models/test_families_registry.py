"""The registry (models/registry.py: config.json's model_type / architectures -> the native class), the
refusals of what no native file implements, and the attention features the families ask for (sliding
windows, MPNet's relative position bias) in the per-sequence SDPA backend against an explicit
computation."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from rose_backend.config import DECODER_TYPES, ENCODER_TYPES, ModelConfig, ModelFolderError
from rose_backend.engine.engine import Engine
from rose_backend.layers.attention import AttentionMetadata, AttentionShape, make_backend
from rose_backend.models.registry import native_family
from rose_testing.folders import make_folder, random_ids


@pytest.mark.parametrize("model_type, architectures, family", [
    ("bert", ["BertModel"], "bert"), ("xlm-roberta", ["XLMRobertaForSequenceClassification"], "bert"),
    ("camembert", ["CamembertModel"], "bert"), ("distilbert", ["DistilBertForMaskedLM"], "distilbert"),
    ("mpnet", ["MPNetForMaskedLM"], "mpnet"), ("modernbert", ["ModernBertModel"], "modernbert"),
    ("gemma3_text", ["Gemma3TextModel"], "gemma3"), ("qwen2", ["Qwen2ForCausalLM"], "llama"),
    ("mistral", ["MistralModel"], "llama"), ("llama", None, "llama"), ("qwen3", ["Qwen3ForCausalLM"], "qwen3"),
    ("bidirectional_pplx_qwen3", ["PPLXQwen3Model"], "qwen3"),
    ("bert", ["JinaBertForMaskedLM"], None),                     # its own modeling code (ALiBi)
    ("qwen2", ["Qwen2ForSequenceClassification"], None),        # a decoder's score head
    ("gemma3", ["Gemma3ForConditionalGeneration"], None),       # the multimodal model_type
    ("t5", ["T5EncoderModel"], None), ("nomic_bert", ["NomicBertModel"], None),
])
def test_native_family(model_type, architectures, family):
    assert native_family(model_type, architectures) == family


def _folder(tmp_path, src, **changes):
    dst = shutil.copytree(src, tmp_path / "m")
    raw = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**raw, **changes}))
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return lambda shape: make_folder(shape, tmp_path_factory.getbasetemp() / "registry" / shape)


def test_an_unknown_model_type_has_no_native_file_and_is_named_as_such(tiny, tmp_path):
    """No native file: the fallback engine serves it (engine/choice.py); the registry refuses to build
    a native model for it, naming every supported type."""
    from rose_backend.engine.choice import engine_choice
    from rose_backend.models.registry import model_class, native_family
    folder = _folder(tmp_path, tiny("tiny-mpnet"), model_type="t5")
    cfg = ModelConfig.from_folder(folder)
    assert native_family("t5") is None and engine_choice(cfg).engine == "fallback"
    with pytest.raises(ModelFolderError, match="model_type 't5' has no native model file") as e:
        model_class(cfg)
    assert all(repr(t) in str(e.value) or t in str(e.value) for t in ENCODER_TYPES + DECODER_TYPES), str(e.value)


def test_remote_code_architectures_are_refused(tiny, tmp_path):
    folder = _folder(tmp_path, tiny("tiny-mpnet"), architectures=["MPNetCustomModel"])
    with pytest.raises(ModelFolderError, match="'MPNetCustomModel'.*not one of transformers' mpnet classes"):
        Engine(ModelConfig.from_folder(folder))


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0}, {"rope_type": "dynamic", "factor": 2.0}])
def test_unsupported_rope_types_are_refused_by_name(tiny, tmp_path, rope):
    folder = _folder(tmp_path, tiny("tiny-llama"), rope_scaling=rope)
    with pytest.raises(ValueError, match=f"rope type '{rope['rope_type']}' is not supported"):
        Engine(ModelConfig.from_folder(folder))


def test_distilbert_sinusoidal_table_made_when_left_out(tiny, tmp_path):
    """transformers' create_sinusoidal_embeddings, where a checkpoint leaves the table out."""
    from safetensors.torch import load_file, save_file
    src = tiny("tiny-distilbert")
    dst = shutil.copytree(src, tmp_path / "m")
    state = load_file(str(dst / "model.safetensors"))
    table = state.pop("embeddings.position_embeddings.weight")
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    seqs = [random_ids(np.random.default_rng(0), 1000, n).tolist() for n in (3, 50)]
    a, b = Engine(ModelConfig.from_folder(src)).embed(seqs), Engine(ModelConfig.from_folder(dst)).embed(seqs)
    np.testing.assert_allclose(a, b, atol=2e-3)                  # the file's copy is rounded to bf16
    assert table.abs().max() <= 1.0


@pytest.mark.parametrize("causal, window, bias", [
    (False, (3, 3), False), (True, (4, 0), False), (False, (2, 5), False), (False, None, True), (False, (3, 3), True)])
def test_sdpa_loop_windows_and_bias_match_explicit_attention(causal, window, bias):
    torch.manual_seed(0)
    lens, heads, kv_heads, d, p = [1, 9, 0, 14], 4, 2, 8, 20
    t = sum(lens)
    q, k, v = torch.randn(t, heads, d), torch.randn(t, kv_heads, d), torch.randn(t, kv_heads, d)
    rel = torch.randn(heads, 2 * p - 1) if bias else None
    shape = AttentionShape(heads, kv_heads, d, torch.float32, causal=causal, windows=(None, window),
                           scale=0.3, position_bias=bias)
    be = make_backend("sdpa_loop", shape, "cpu")
    cu = torch.tensor(np.cumsum([0, *lens]), dtype=torch.int32)
    be.plan(AttentionMetadata(cu, max(lens), lens, causal))
    got = be.run(q, k, v, window=window, bias=rel)
    want = torch.zeros_like(q)
    for s, n in zip(cu[:-1].tolist(), lens):
        for h in range(heads):
            for i in range(n):
                js = [j for j in range(n) if (not causal or j <= i)
                      and (window is None or i - window[0] <= j <= i + window[1])]
                scores = torch.stack([(q[s + i, h] @ k[s + j, h // 2]) * 0.3 + (rel[h, p - 1 + j - i] if bias else 0)
                                      for j in js])
                want[s + i, h] = torch.softmax(scores, 0) @ v[[s + j for j in js], h // 2]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
