"""Random-weight Hugging Face model folders at the benchmark shapes, and their float32 reference.

    folder = make_folder("bge-m3", "/tmp/rose-bench/bge-m3", device="cuda")
    ref = Reference(folder, device="cuda")
    ref.embed([[5, 6, 7], ...])                # np.float32 [n, D]: HF transformers, float32, unpadded

A folder holds config.json, model.safetensors (random weights, rounded to bf16 once so the bf16
servers and the float32 reference hold the same numbers), a WordLevel tokenizer.json over the whole
vocabulary (text "w123 w456" is ids [123, 456], one word one token, no special tokens added), its
tokenizer_config.json, and the sentence-transformers files that say pooling and normalization.
Weights are initialised on `device` (nothing large travels), so a 0.6B folder takes seconds.

torch and transformers are imported inside the functions.
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
    "tiny-qwen3": (dict(model_type="qwen3", architectures=["Qwen3Model"], vocab_size=1000, hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, max_position_embeddings=512, rms_norm_eps=1e-6, hidden_act="silu",
                        rope_theta=1_000_000.0, attention_bias=False, tie_word_embeddings=True,
                        use_sliding_window=False, use_bidirectional_attention=True, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2, use_cache=False), "mean", False, 512),
}
ALIASES = {"bge": "bge-m3", "pplx": "pplx-embed", "pplx-embed-1-0.6b": "pplx-embed", "qwen3": "pplx-embed"}


def shape_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return name


def max_seq_len(config: dict) -> int:
    """Longest sequence the folder accepts (XLM-R numbers positions from pad_token_id + 1)."""
    offset = config.get("pad_token_id", 1) + 1 if config["model_type"] in ("xlm-roberta", "roberta") else 0
    return config["max_position_embeddings"] - offset


def make_folder(name: str, path: str | Path, device: str = "cpu", seed: int = 0) -> Path:
    """Write a random-weight folder of shape `name` (see SHAPES) unless one is already there."""
    import torch
    from safetensors.torch import save_file

    name = shape_name(name)
    path = Path(path)
    config, pooling, normalize, max_len = SHAPES[name]
    if (path / "model.safetensors").exists() and (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _hf_model(config, device)
    with torch.no_grad():                        # norms away from 1 so that their weights are tested too
        gen = torch.Generator(device=device).manual_seed(seed)
        for pname, p in model.named_parameters():
            if pname.endswith(("norm.weight", "LayerNorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=device))
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()
             if not k.endswith(("position_ids", "token_type_ids"))}
    del model
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=2))
    write_tokenizer(path, config["vocab_size"], min(max_len, max_seq_len(config)))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": config["hidden_size"], "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": min(max_len, max_seq_len(config)), "do_lower_case": False}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    return path


def _hf_model(config: dict, device: str):
    import torch
    from transformers import AutoConfig, AutoModel

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    if config["model_type"] == "qwen3":               # transformers 5 reads RoPE from rope_parameters
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta")}
    hf_config = AutoConfig.for_model(config["model_type"], **kwargs)
    extra = {"add_pooling_layer": False} if config["model_type"] in ("bert", "xlm-roberta", "roberta") else {}
    with torch.device(device):
        return AutoModel.from_config(hf_config, **extra).eval()


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


def folder_pooling(folder: str | Path) -> tuple[str, bool, bool]:
    """(pooling mode, normalize, bidirectional) as the folder's sentence-transformers files say."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    pooling, normalize = ("mean" if config["model_type"] == "qwen3" else "cls"), False
    if (folder / "modules.json").exists():
        for m in json.loads((folder / "modules.json").read_text()):
            if m.get("type", "").endswith("Normalize"):
                normalize = True
            elif m.get("type", "").endswith("Pooling") and (folder / m.get("path", "") / "config.json").exists():
                pc = json.loads((folder / m["path"] / "config.json").read_text())
                pooling = pc.get("pooling_mode") or next(
                    (k for k, flag in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                                       ("lasttoken", "pooling_mode_lasttoken")) if pc.get(flag)), pooling)
    bidirectional = bool(config.get("use_bidirectional_attention") or config.get("is_bidirectional")
                         or config.get("is_causal") is False)
    return pooling, normalize, bidirectional


class Reference:
    """The float32 Hugging Face reference: AutoModel in float32, eager attention, one sequence at a
    time with no padding, pooled as the folder says (bidirectional decoders without a mask)."""

    def __init__(self, folder: str | Path, device: str = "cpu"):
        import torch
        from transformers import AutoModel

        self.folder, self.device = Path(folder), device
        self.pooling, self.normalize, self.bidirectional = folder_pooling(folder)
        self.config = json.loads((self.folder / "config.json").read_text())
        self.is_decoder = self.config["model_type"] == "qwen3"
        extra = {} if self.is_decoder else {"add_pooling_layer": False}
        self.model = AutoModel.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager",
                                               **extra).to(device).eval()
        if self.bidirectional:
            for m in self.model.modules():
                if hasattr(m, "is_causal"):
                    m.is_causal = False

    def embed(self, token_lists) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for ids in token_lists:
                x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)[None]
                if self.is_decoder:
                    mask = {"full_attention": None} if self.bidirectional else None
                    h = self.model(input_ids=x, attention_mask=mask).last_hidden_state[0]
                else:
                    h = self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
                e = {"cls": h[0], "mean": h.mean(0), "lasttoken": h[-1]}[self.pooling]
                if self.normalize:
                    e = torch.nn.functional.normalize(e, dim=-1)
                out.append(e.float().cpu().numpy())
        return np.stack(out)

    def close(self):
        import torch

        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
