"""Qwen3 decoders (Qwen3-Embedding and pplx-embed shapes) against Hugging Face transformers.

Small random-weight folders over a grid of layer counts, GQA ratios and head dims, in both
attention modes; the packed ragged batch through our engine must match transformers' Qwen3Model
run one sequence at a time (1 - cos <= 1e-4 in float32), per token and after pooling.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig, ModelFolderError
from rose_backend.engine.engine import Engine
from rose_backend.layers.attention import AttentionMetadata
from rose_backend.layers.rotary import RotaryEmbedding
from rose_backend.models import build_model
from rose_testing.compare import cos_dist
from rose_testing.qwen3 import QUERY_PROMPT, write_qwen3_folder
from rose_testing.reference import Reference

TOL = 1e-4
LENGTHS = (7, 1, 33, 12, 2)                 # ragged, with a length-1 sequence among them

# (num_layers, num_heads, num_kv_heads, head_dim): MHA, GQA 2:1 and 4:1, MQA, head dims 16..128
SHAPES = [(1, 4, 4, 16), (2, 4, 2, 32), (3, 8, 2, 16), (2, 4, 1, 64), (1, 2, 1, 128)]


def random_sequences(n_vocab: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, size=n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def folder_for(tmp_path_factory):
    cache = {}

    def make(style: str, shape=(2, 4, 2, 16), **kw):
        key = (style, shape, tuple(sorted(kw.items())))
        if key not in cache:
            layers, heads, kv_heads, head_dim = shape
            path = tmp_path_factory.mktemp("qwen3")
            cache[key] = write_qwen3_folder(path, style=style, num_layers=layers, num_heads=heads,
                                            num_kv_heads=kv_heads, head_dim=head_dim, **kw)
        return cache[key]
    return make


@pytest.mark.parametrize("style", ["qwen3-embedding", "pplx-embed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}-H{}-KV{}-D{}".format(*s))
def test_ragged_batch_matches_hf_per_sequence(folder_for, style, shape):
    folder = folder_for(style, shape)
    cfg = ModelConfig.from_folder(folder)
    assert cfg.causal == (style == "qwen3-embedding")
    hf = Reference(folder)
    seqs = random_sequences(cfg.vocab_size)
    refs = [hf.hidden(s).numpy() for s in seqs]                                 # one at a time

    engine = Engine(cfg)
    # every token of the packed forward
    ids = torch.tensor([t for s in seqs for t in s])
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    cu = torch.tensor(np.cumsum([0, *map(len, seqs)]), dtype=torch.int32)
    engine.model.attn.plan(AttentionMetadata(cu, max(LENGTHS), list(LENGTHS), cfg.causal))
    with torch.inference_mode():
        hidden = engine.model(ids, positions).numpy()
    assert cos_dist(hidden, np.concatenate(refs)).max() <= TOL

    # pooled, through the engine
    pooled_ref = np.stack([r[-1] if cfg.pooling == "lasttoken" else r.mean(0) for r in refs])
    emb = engine.embed(seqs)
    assert emb.shape == (len(seqs), cfg.hidden_size)
    assert cos_dist(emb, pooled_ref).max() <= TOL
    if cfg.normalize:
        np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("style", ["qwen3-embedding", "pplx-embed"])
def test_ragged_batch_equals_one_at_a_time(folder_for, style):
    engine = Engine(ModelConfig.from_folder(folder_for(style)))
    seqs = random_sequences(engine.cfg.vocab_size, lengths=(5, 40, 1, 17), seed=1)
    batched = engine.embed(seqs)
    single = np.concatenate([engine.embed([s]) for s in seqs])
    assert cos_dist(batched, single).max() <= 1e-6


def test_causal_lm_folder_loads_and_matches(folder_for):
    """A Qwen3ForCausalLM checkpoint ("model." names plus lm_head) serves the same embeddings."""
    plain = Engine(ModelConfig.from_folder(folder_for("qwen3-embedding", seed=3)))
    lm = Engine(ModelConfig.from_folder(folder_for("qwen3-embedding", seed=3, causal_lm=True)))
    seqs = random_sequences(plain.cfg.vocab_size)
    np.testing.assert_array_equal(plain.embed(seqs), lm.embed(seqs))


def test_query_prompt_template(folder_for):
    """The Qwen3-Embedding query template comes from config_sentence_transformers.json, and the
    templated text's tokens (with the appended <|endoftext|>) embed like HF's last token."""
    from tokenizers import Tokenizer

    folder = folder_for("qwen3-embedding")
    cfg = ModelConfig.from_folder(folder)
    assert cfg.prompts == {"query": QUERY_PROMPT, "document": ""}
    assert (cfg.pooling, cfg.normalize, cfg.causal) == ("lasttoken", True, True)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tok.encode(cfg.prompts["query"] + "the cat sat on the mat").ids
    assert ids[-1] == tok.token_to_id("<|endoftext|>") and 0 not in ids
    ref = Reference(folder).hidden(ids)[-1].numpy()
    assert cos_dist(Engine(cfg).embed([ids])[0], ref) <= TOL


def test_pplx_folder_config(folder_for):
    cfg = ModelConfig.from_folder(folder_for("pplx-embed"))
    assert (cfg.model_type, cfg.causal, cfg.pooling, cfg.normalize) == ("qwen3", False, "mean", False)
    assert cfg.prompts == {}


def _edit_config(folder, tmp_path, **changes):
    import shutil
    dst = tmp_path / "edited"
    shutil.copytree(folder, dst)
    raw = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


@pytest.mark.parametrize("changes, causal", [
    ({}, True),
    ({"use_bidirectional_attention": True}, False),
    ({"is_causal": False}, False),
    ({"attention_type": "bidirectional"}, False),
    ({"is_bidirectional": True}, False),
])
def test_attention_mode_and_default_pooling(folder_for, tmp_path, changes, causal):
    """Without modules.json: last-token pooling for causal decoders, mean for bidirectional ones."""
    dst = _edit_config(folder_for("qwen3-embedding"), tmp_path, **changes)
    (dst / "modules.json").unlink()
    cfg = ModelConfig.from_folder(dst)
    assert cfg.causal == causal
    assert cfg.pooling == ("lasttoken" if causal else "mean")


def test_rope_parameters_and_defaults(folder_for, tmp_path):
    dst = _edit_config(folder_for("qwen3-embedding"), tmp_path, rope_theta=None, rope_scaling=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, rms_norm_eps=None)
    cfg = ModelConfig.from_folder(dst)
    assert cfg.rope_theta == 5000.0 and cfg.norm_eps == 1e-6


@pytest.mark.parametrize("changes", [
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
    {"use_sliding_window": True},
])
def test_unsupported_variants_are_refused(folder_for, tmp_path, changes):
    dst = _edit_config(folder_for("qwen3-embedding"), tmp_path, **changes)
    with pytest.raises(ModelFolderError):
        ModelConfig.from_folder(dst)


def test_loader_is_strict(folder_for, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = folder_for("pplx-embed")
    state = load_file(str(folder / "model.safetensors"))
    for name, edit in [("missing", lambda s: s.pop("layers.0.self_attn.k_proj.weight")),
                       ("unexpected", lambda s: s.__setitem__("layers.0.extra.weight", torch.zeros(1)))]:
        dst = _edit_config(folder, tmp_path / name)
        bad = dict(state)
        edit(bad)
        save_file(bad, str(dst / "model.safetensors"))
        with pytest.raises(KeyError, match="k_proj|qkv_proj|extra"):
            build_model(ModelConfig.from_folder(dst))
    dst = _edit_config(folder, tmp_path / "shape", intermediate_size=64)
    with pytest.raises(ValueError, match="shape"):
        build_model(ModelConfig.from_folder(dst))


def test_rotary_cache_stays_float32_when_cast():
    rope = RotaryEmbedding(head_dim=8, max_positions=64, base=10_000.0)
    ref = rope.cos_sin_cache.clone()
    rope.to(torch.bfloat16)
    assert rope.cos_sin_cache.dtype == torch.float32
    torch.testing.assert_close(rope.cos_sin_cache, ref)
    q = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    q2, k2 = rope(torch.zeros(5, dtype=torch.long), q, q[:, :1])
    assert q2.dtype == torch.bfloat16
    torch.testing.assert_close(q2, q)                          # position 0 is the identity
