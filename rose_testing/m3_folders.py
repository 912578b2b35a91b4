"""Random-weight BGE-M3-style folders: an XLM-RoBERTa encoder, its two heads, a local tokenizer.

    folder = make_m3_folder(tmp / "m3", hidden=64, layers=2, max_seq_length=32)
    # config.json + model.safetensors (random XLM-R), sparse_linear.pt, colbert_linear.pt (random
    # heads, plain state dicts as BGE-M3 ships them; heads="safetensors" writes .safetensors instead,
    # heads=None none), tokenizer.json (a small Unigram / Metaspace tokenizer with XLM-R's special
    # tokens <s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask> last, and its "<s> $A </s>" template),
    # tokenizer_config.json / special_tokens_map.json (XLMRobertaTokenizer, so Hugging Face's
    # AutoTokenizer and FlagEmbedding load it offline), and the sentence-transformers files (CLS
    # pooling, Normalize) that BGE-M3 ships.

No hub access: the tokenizer's vocabulary is built here (every ASCII letter, digit and punctuation
mark as a piece, so no text maps to <unk> unless it holds other characters, plus whole words of
a small list so that texts have repeated multi-character tokens).
torch and transformers are imported inside the functions.
"""
from __future__ import annotations

import json
import string
from pathlib import Path

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
WORDS = ("the", "rose", "is", "a", "flower", "search", "dense", "sparse", "vector", "token", "model", "server",
         "red", "blue", "of", "and", "in", "to", "hybrid", "lexical", "weight", "colbert", "late", "interaction")


def write_xlmr_tokenizer(path: Path, max_len: int) -> int:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json; returns the vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = [(t, 0.0) for t in SPECIALS]
    pieces += [("\u2581" + w, -2.0 - 0.01 * i) for i, w in enumerate(WORDS)]
    pieces += [(w, -3.0 - 0.01 * i) for i, w in enumerate(WORDS)]
    chars = string.ascii_letters + string.digits + string.punctuation
    pieces += [("\u2581", -4.0)] + [(c, -5.0 - 0.001 * i) for i, c in enumerate(chars)]
    pieces += [("\u2581" + c, -6.0 - 0.001 * i) for i, c in enumerate(chars)]
    pieces.append(("<mask>", 0.0))
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    # special tokens written in a text swallow the space before them (lstrip), as transformers 5
    # XLMRobertaTokenizer tokenizes them, so this folder tokenizes alike in both
    tok.add_special_tokens([AddedToken(t, lstrip=True, special=True) for t in SPECIALS + ("<mask>",)])
    tok.save(str(path / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
               "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": max_len, **special}, indent=1))
    return len(pieces)


def make_m3_folder(path: str | Path, hidden: int = 64, layers: int = 2, heads: int = 4, colbert_dim: int | None = None,
                   max_seq_length: int = 32, max_positions: int = 64, seed: int = 0,
                   head_format: str | None = "pt") -> Path:
    """Write the folder (see the module docstring); returns its path. colbert_dim defaults to the
    hidden size, as BGE-M3's (and what FlagEmbedding builds when it loads a folder)."""
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_xlmr_tokenizer(path, max_seq_length)
    torch.manual_seed(seed)
    cfg = transformers.XLMRobertaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, max_position_embeddings=max_positions + 2, type_vocab_size=1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    model = transformers.XLMRobertaModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():        # LayerNorms and biases away from their defaults, so they are tested too
        for n, p in model.named_parameters():
            if "LayerNorm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    if head_format is not None:
        write_heads(path, hidden, colbert_dim or hidden, seed, head_format)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules, indent=1))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                "do_lower_case": False}))
    return path


def write_heads(path: Path, hidden: int, colbert_dim: int, seed: int = 0, head_format: str = "pt") -> None:
    """sparse_linear / colbert_linear: random nn.Linear state dicts (.pt as BGE-M3, or .safetensors).
    The sparse bias is centred so that about half of the tokens get a weight > 0."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    sparse = torch.nn.Linear(hidden, 1)
    colbert = torch.nn.Linear(hidden, colbert_dim)
    with torch.no_grad():
        sparse.weight.copy_(torch.randn(1, hidden, generator=gen) / hidden ** 0.5)
        sparse.bias.fill_(0.05)
        colbert.weight.copy_(torch.randn(colbert_dim, hidden, generator=gen) / hidden ** 0.5)
        colbert.bias.copy_(0.1 * torch.randn(colbert_dim, generator=gen))
    for name, layer in (("sparse_linear", sparse), ("colbert_linear", colbert)):
        state = {k: v.detach().clone().contiguous() for k, v in layer.state_dict().items()}
        if head_format == "safetensors":
            from safetensors.torch import save_file
            save_file(state, str(path / f"{name}.safetensors"))
        else:
            torch.save(state, str(path / f"{name}.pt"))


def center_sparse_bias(path: Path, device: str = "cpu", tokens: int = 256, seed: int = 0) -> float:
    """Re-bias the folder's sparse_linear.pt so that about half of the tokens get a weight > 0;
    returns the share of a random sequence's tokens that do. A deep random encoder maps every token
    to nearly one direction, so a random sparse head gives them all a weight of one sign (all > 0,
    or all 0 after the ReLU). The bias is minus the median of w . h over that sequence's final
    hidden states (float32 Hugging Face)."""
    import numpy as np
    import torch

    from rose_testing.reference import Reference

    ref = Reference(path, device)
    rng = np.random.default_rng(seed)
    hidden = ref.hidden(rng.integers(4, ref.cfg.vocab_size - 1, size=min(tokens, ref.cfg.max_seq_length)))
    ref.close()
    state = torch.load(str(path / "sparse_linear.pt"), map_location="cpu", weights_only=True)
    raw = hidden @ state["weight"][0].float()
    state["bias"] = -raw.median().reshape(1).to(state["bias"].dtype)
    torch.save(state, str(path / "sparse_linear.pt"))
    return float((raw + state["bias"].float() > 0).float().mean())


def flag_m3(folder, max_length: int):
    """FlagEmbedding's M3Embedder (BGEM3FlagModel) on the CPU in float32, BGE-M3's reference outputs,
    imported without the package's __init__ (which imports rerankers that transformers 5 breaks)."""
    import importlib.util
    import sys
    import types
    for name in ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder"):
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        path = ([p + "/" + child for p in sys.modules[parent].__path__] if parent
                else list(importlib.util.find_spec(name).submodule_search_locations))
        module = types.ModuleType(name)
        module.__path__ = path
        sys.modules[name] = module
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder
    return M3Embedder(str(folder), use_fp16=False, devices="cpu", normalize_embeddings=True,
                      pooling_method="cls", passage_max_length=max_length, batch_size=4)
