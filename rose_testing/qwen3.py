"""Random-weight Qwen3 model folders for tests, written at test time (nothing large is committed).

    folder = write_qwen3_folder(tmp_path / "m", style="qwen3-embedding", num_layers=2)
    Reference(folder).hidden(ids)              # transformers Qwen3Model on the same weights (reference.py)

Two styles, matching the two families served:
- "qwen3-embedding": model_type qwen3, causal, last-token pooling + Normalize, the
  "Instruct: ...\\nQuery: " query prompt, an <|endoftext|> token appended by the tokenizer.
- "pplx-embed": model_type bidirectional_pplx_qwen3 with use_bidirectional_attention, mean
  pooling, no prompts.
The 0.6B benchmark shapes (random weights made on the GPU, a WordLevel "w<id>" tokenizer) are
folders.make_folder("pplx-embed", ...).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
WORDS = ("the a of to and in is was for on that with as by at from it an be are this which or has "
         "query passage instruct given web search retrieve relevant passages answer cat dog sat mat "
         "embedding model server triton rose qwen apple banana river mountain blue green red "
         "Instruct Given Query : , . ? !").split()
EOS = "<|endoftext|>"
UNK = "<unk>"


def qwen3_config_dict(*, vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 2,
                      num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
                      intermediate_size: int = 96, rope_theta: float = 1_000_000.0,
                      max_position_embeddings: int = 512, style: str = "qwen3-embedding") -> dict:
    cfg = {
        "architectures": ["Qwen3Model"], "model_type": "qwen3", "vocab_size": vocab_size,
        "hidden_size": hidden_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "intermediate_size": intermediate_size,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta, "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": True,
        "use_sliding_window": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 1,
    }
    if style == "pplx-embed":
        cfg.update(architectures=["PPLXQwen3Model"], model_type="bidirectional_pplx_qwen3",
                   use_bidirectional_attention=True, use_cache=False)
    elif style != "qwen3-embedding":
        raise ValueError(f"unknown style {style!r}")
    return cfg


def write_qwen3_folder(path: Path, *, style: str = "qwen3-embedding", seed: int = 0,
                       causal_lm: bool = False, pooling: str | None = None, **shape) -> Path:
    """Write config.json, model.safetensors (random weights, fixed seed), tokenizer.json and the
    sentence-transformers files. causal_lm=True saves the same weights under Qwen3ForCausalLM
    names ("model." prefix, plus an lm_head). Returns the folder."""
    from safetensors.torch import save_file
    from transformers import Qwen3Model

    from rose_testing.folders import hf_qwen3_config, write_st_files

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = qwen3_config_dict(style=style, **shape)
    torch.manual_seed(seed)
    model = Qwen3Model(hf_qwen3_config(cfg)).eval()
    with torch.no_grad():                   # HF initialises norms to 1; randomise them so they are tested too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if causal_lm:                           # Qwen3ForCausalLM's names: the same decoder under "model."
        state = {f"model.{k}": v for k, v in state.items()}
        state["lm_head.weight"] = torch.randn(cfg["vocab_size"], cfg["hidden_size"])
        cfg.update(architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    _write_tokenizer(path, cfg["vocab_size"], append_eos=style == "qwen3-embedding")

    pooling = pooling or ("lasttoken" if style == "qwen3-embedding" else "mean")
    prompts = {"query": QUERY_PROMPT, "document": ""} if style == "qwen3-embedding" else {}
    write_st_files(path, cfg["hidden_size"], pooling, normalize=style == "qwen3-embedding", max_len=256,
                   prompts=prompts)
    return path


def _write_tokenizer(path: Path, vocab_size: int, append_eos: bool) -> None:
    """A WordLevel tokenizer over WORDS (ids 2..), <unk> = 0, <|endoftext|> = 1; Qwen3-Embedding's
    tokenizer appends <|endoftext|> to every text, which its last-token pooling reads."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {UNK: 0, EOS: 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    assert len(vocab) <= vocab_size, "vocab_size too small for the test vocabulary"
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if append_eos:
        tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    tok.add_special_tokens([EOS])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"model_max_length": 256, "eos_token": EOS, "pad_token": EOS, "unk_token": UNK,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
