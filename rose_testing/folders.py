"""Random-weight Hugging Face model folders: the benchmark shapes and the small test shapes.

    folder = make_folder("bge-m3", "/tmp/rose-bench/bge-m3", device="cuda")
    folder = make_folder("tiny-bert", tmp_path / "m", pooling="cls", normalize=False)
    Reference(folder).embed([[5, 6, 7], ...])  # np.float32 [n, D]: HF transformers (reference.py)

A folder holds config.json, model.safetensors (random weights, rounded to bf16 once so the bf16
servers and the float32 reference hold the same numbers; norm weights away from 1 and biases away
from 0, so that they are tested too), a WordLevel tokenizer.json over the whole vocabulary (text
"w123 w456" is ids [123, 456], one word one token, no special tokens added), its
tokenizer_config.json, and the sentence-transformers files that say pooling and normalization
(write_st_files, shared with qwen3.py). Weights are made on `device` (nothing large travels), so a
0.6B folder takes seconds. torch and transformers are imported inside the functions.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")     # ids 0..3; words w4 .. w{vocab-1} follow
FIRST_WORD_ID = len(SPECIAL_TOKENS)

# name -> (config.json, pooling, normalize, sentence-transformers max_seq_length)
SHAPES: dict[str, tuple[dict, str, bool, int]] = {
    # BGE-M3: XLM-RoBERTa large, CLS pooling, normalized.
    "bge-m3": (dict(model_type="xlm-roberta", architectures=["XLMRobertaModel"], vocab_size=250002,
                    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                    max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                    bos_token_id=0, eos_token_id=2, hidden_act="gelu"), "cls", True, 8192),
    # pplx-embed-1-0.6b: Qwen3 0.6B shape, bidirectional attention, mean pooling.
    "pplx-embed": (dict(model_type="qwen3", architectures=["Qwen3Model"], vocab_size=151669, hidden_size=1024,
                        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                        intermediate_size=3072, max_position_embeddings=32768, rms_norm_eps=1e-6,
                        hidden_act="silu", rope_theta=1_000_000.0, attention_bias=False,
                        tie_word_embeddings=True, use_sliding_window=False, use_bidirectional_attention=True,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, use_cache=False), "mean", False, 32768),
    # Tiny shapes for the CPU test of the tool itself (not benchmarks).
    "tiny-bert": (dict(model_type="bert", architectures=["BertModel"], vocab_size=1000, hidden_size=64,
                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=1,
                       hidden_act="gelu"), "mean", True, 512),
    "tiny-xlm-roberta": (dict(model_type="xlm-roberta", architectures=["XLMRobertaModel"], vocab_size=1000,
                              hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                              max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                              hidden_act="gelu"), "cls", True, 512),
    "tiny-qwen3": (dict(model_type="qwen3", architectures=["Qwen3Model"], vocab_size=1000, hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, max_position_embeddings=512, rms_norm_eps=1e-6, hidden_act="silu",
                        rope_theta=1_000_000.0, attention_bias=False, tie_word_embeddings=True,
                        use_sliding_window=False, use_bidirectional_attention=True, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2, use_cache=False), "mean", False, 512),
}
# initializer_range 0.2: attention scores far from uniform, so that windows and position biases show
_ENC = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            initializer_range=0.2)
_DEC = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=512, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            initializer_range=0.2)
# The native families (rose_backend/models): a tiny shape each for the CPU tests (tests/models/test_families.py;
# windows of 16 tokens or less so that short sequences cross them) and a real one for the GPU suite.
SHAPES.update({
    "tiny-camembert": (dict(_ENC, model_type="camembert", architectures=["CamembertModel"], max_position_embeddings=130,
                            type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1), "mean", False, 128),
    "tiny-distilbert": (dict(model_type="distilbert", architectures=["DistilBertModel"], vocab_size=1000, dim=32,
                             n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128,
                             sinusoidal_pos_embds=True, pad_token_id=0, initializer_range=0.2), "cls", True, 128),
    "tiny-mpnet": (dict(_ENC, model_type="mpnet", architectures=["MPNetForMaskedLM"], max_position_embeddings=202,
                        layer_norm_eps=1e-5, pad_token_id=1), "mean", True, 200),
    "tiny-modernbert": (dict(_ENC, model_type="modernbert", architectures=["ModernBertModel"], num_hidden_layers=3,
                             max_position_embeddings=512, global_attn_every_n_layers=2, local_attention=16,
                             pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2),
                        "cls", True, 256),
    "tiny-gemma3": (dict(_DEC, model_type="gemma3_text", architectures=["Gemma3TextModel"], num_hidden_layers=3,
                         head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention",
                                                                      "sliding_attention"],
                         query_pre_attn_scalar=24, use_bidirectional_attention=True, rope_theta=1e6,
                         rope_local_base_freq=1e4, hidden_activation="gelu_pytorch_tanh"), "mean", True, 256),
    "tiny-qwen2": (dict(_DEC, model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1e6,
                        use_sliding_window=True, sliding_window=12, max_window_layers=1), "lasttoken", True, 256),
    "tiny-mistral": (dict(_DEC, model_type="mistral", architectures=["MistralModel"], sliding_window=16,
                          rope_theta=1e4), "lasttoken", True, 256),
    "tiny-llama": (dict(_DEC, model_type="llama", architectures=["LlamaModel"], num_key_value_heads=1, is_causal=False,
                        attention_bias=True, rope_theta=5e5, rope_scaling=dict(
                            rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=64)), "mean", False, 256),
    # GPU shapes: the published models' widths (layers trimmed by the GPU suite)
    "all-mpnet-base-v2": (dict(model_type="mpnet", architectures=["MPNetForMaskedLM"], vocab_size=30527, hidden_size=768,
                               num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                               max_position_embeddings=514, layer_norm_eps=1e-5, pad_token_id=1), "mean", True, 384),
    "distilbert-base": (dict(model_type="distilbert", architectures=["DistilBertModel"], vocab_size=30522, dim=768,
                             n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512, pad_token_id=0),
                        "mean", True, 512),
    "gte-modernbert-base": (dict(model_type="modernbert", architectures=["ModernBertModel"], vocab_size=50368,
                                 hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
                                 max_position_embeddings=8192, global_attn_every_n_layers=3, local_attention=128,
                                 global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=50283,
                                 bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282),
                            "cls", True, 8192),
    "embeddinggemma-300m": (dict(model_type="gemma3_text", architectures=["Gemma3TextModel"], vocab_size=262144,
                                 hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1,
                                 head_dim=256, intermediate_size=1152, max_position_embeddings=2048, sliding_window=512,
                                 query_pre_attn_scalar=256, use_bidirectional_attention=True, rope_theta=1e6,
                                 rope_local_base_freq=1e4, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                                 bos_token_id=2, eos_token_id=1), "mean", True, 2048),
    "gte-qwen2-1.5b": (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=151646, hidden_size=1536,
                            num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                            max_position_embeddings=131072, rope_theta=1e6, pad_token_id=1, bos_token_id=0,
                            eos_token_id=2), "lasttoken", True, 8192),
    "e5-mistral-7b": (dict(model_type="mistral", architectures=["MistralModel"], vocab_size=32000, hidden_size=4096,
                           num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                           max_position_embeddings=32768, sliding_window=4096, rope_theta=1e4, pad_token_id=2,
                           bos_token_id=1, eos_token_id=2), "lasttoken", True, 4096),
    "llama-3.2-1b": (dict(model_type="llama", architectures=["LlamaModel"], vocab_size=128256, hidden_size=2048,
                          num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                          intermediate_size=8192, max_position_embeddings=131072, rope_theta=5e5, rope_scaling=dict(
                              rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=8192), pad_token_id=2, bos_token_id=0, eos_token_id=1),
                     "lasttoken", True, 8192),
})
ALIASES = {"bge": "bge-m3", "pplx": "pplx-embed", "pplx-embed-1-0.6b": "pplx-embed", "qwen3": "pplx-embed"}


def shape_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return name


def max_seq_len(config: dict) -> int:
    """Longest sequence the folder accepts (RoBERTa's family and MPNet number positions from an offset)."""
    from rose_backend.config import POSITION_OFFSETS
    offset = POSITION_OFFSETS.get(config["model_type"], 0)
    offset = config.get("pad_token_id", 1) + 1 if offset == "pad" else offset
    return config["max_position_embeddings"] - offset


def make_folder(name: str, path: str | Path, device: str = "cpu", seed: int = 0, *, pooling: str | None = None,
                normalize: bool | None = None, **config) -> Path:
    """Write a random-weight folder of shape `name` (see SHAPES; `config` overrides config.json
    keys, e.g. num_hidden_layers=2) unless one is already there."""
    name = shape_name(name)
    path = Path(path)
    base, base_pooling, base_normalize, max_len = SHAPES[name]
    config = {**base, **config}
    if (path / "model.safetensors").exists() and (path / "config.json").exists():
        return path
    write_weights(path, config, device, seed)
    write_tokenizer(path, config["vocab_size"], min(max_len, max_seq_len(config)))
    write_st_files(path, config.get("hidden_size") or config["dim"], base_pooling if pooling is None else pooling,
                   base_normalize if normalize is None else normalize, min(max_len, max_seq_len(config)))
    return path


def write_weights(path: Path, config: dict, device: str = "cpu", seed: int = 0) -> None:
    """config.json and model.safetensors: transformers' random init (seed), norm weights ~ N(1, 0.1),
    biases ~ N(0, 0.1) and relative position biases ~ N(0, 2), every tensor rounded to bf16."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _hf_model(config, device)
    with torch.no_grad():
        gen = torch.Generator(device=device).manual_seed(seed)
        for pname, p in model.named_parameters():
            if pname.endswith(("norm.weight", "LayerNorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=device))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, device=device))
            elif pname.endswith("relative_attention_bias.weight"):      # MPNet: score biases of a few units
                p.copy_(2.0 * torch.randn(p.shape, generator=gen, device=device))
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()
             if not k.endswith(("position_ids", "token_type_ids"))}
    del model
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=2))


def write_st_files(path: Path, hidden: int, pooling: str, normalize: bool, max_len: int,
                   prompts: dict | None = None) -> None:
    """The sentence-transformers files: modules.json (Transformer, Pooling[, Normalize]), the pooling
    config, sentence_bert_config.json (max_seq_length) and config_sentence_transformers.json (prompts)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len, "do_lower_case": False}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))


def _hf_model(config: dict, device: str):
    import torch
    from transformers import AutoConfig, AutoModel, Qwen3Model

    with torch.device(device):
        if config["model_type"] in ("qwen3", "bidirectional_pplx_qwen3"):
            return Qwen3Model(hf_qwen3_config(config)).eval()
        kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
        hf_config = AutoConfig.for_model(config["model_type"], **kwargs)
        try:                                              # BERT-likes: no pooler (heads are not embedders')
            return AutoModel.from_config(hf_config, add_pooling_layer=False).eval()
        except TypeError:                                 # models without one (DistilBERT, ModernBERT, decoders)
            return AutoModel.from_config(hf_config).eval()


def hf_qwen3_config(config: dict):
    """transformers' Qwen3Config for a Qwen3-family config.json (pplx's model_type read as qwen3;
    transformers 5 reads RoPE from rope_parameters)."""
    from transformers import Qwen3Config

    keep = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "use_bidirectional_attention",
                                                         "rope_theta", "rope_scaling", "torch_dtype")}
    return Qwen3Config(**keep, rope_parameters={"rope_type": "default", "rope_theta": config.get("rope_theta", 1e6)})


def write_tokenizer(path: Path, vocab_size: int, max_len: int) -> None:
    """A WordLevel tokenizer over the whole vocabulary: word "w{i}" is token i; no specials added."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(FIRST_WORD_ID, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "bos_token": "<s>",
         "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "padding_side": "right"}))


def random_ids(rng: np.random.Generator, vocab_size: int, length: int) -> np.ndarray:
    """Token ids of ordinary words (no special token, so no pad id inside a sequence)."""
    return rng.integers(FIRST_WORD_ID, vocab_size, size=length, dtype=np.int32)


def ids_to_text(ids) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


# The default model's shape where the tests' servers need its tokenizer, prompts and 384 dimensions
# but not its trained weights: one layer and a narrow feed-forward, so a forward pass on the CPU costs
# a fraction of all-MiniLM's six (rose_testing.folders.minilm_shaped_folder).
MINILM_SHAPED = dict(num_hidden_layers=1, intermediate_size=384)


def minilm_shaped_folder(path: str | Path, source: str | Path | None = None, seed: int = 0, **config) -> Path:
    """A random-weight copy of the default model folder (all-MiniLM-L6-v2, or `source`): its
    tokenizer, sentence-transformers files and config.json, with the weights written anew for the
    config overridden by MINILM_SHAPED and `config`. Written once: an existing folder is returned as it
    is; the folder appears whole (written beside it, then renamed), so processes may race to make it."""
    import os
    import shutil
    import tempfile

    from rose_backend.config import default_model_dir

    path, source = Path(path), Path(source or default_model_dir())
    if (path / "model.safetensors").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    try:
        for item in source.iterdir():
            if item.name not in ("model.safetensors", "config.json", "README.md"):
                (shutil.copytree if item.is_dir() else shutil.copy)(item, tmp / item.name)
        base = json.loads((source / "config.json").read_text())
        write_weights(tmp, {**base, **MINILM_SHAPED, **config}, seed=seed)
        cfg = json.loads((tmp / "config.json").read_text())      # served and compared in float32, as the original
        (tmp / "config.json").write_text(json.dumps({**cfg, "torch_dtype": base.get("torch_dtype", "float32")}, indent=2))
        try:
            os.rename(tmp, path)
        except OSError:                   # another process made it first
            if not (path / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
