"""Random-weight Qwen3 model folders for tests, written at test time (nothing large is committed).

    folder = write_qwen3_folder(tmp_path / "m", style="qwen3-embedding", num_layers=2)
    hf = hf_reference_model(folder)            # transformers Qwen3Model on the same weights

Two styles, matching the two families served:
- "qwen3-embedding": model_type qwen3, causal, last-token pooling + Normalize, the
  "Instruct: ...\\nQuery: " query prompt, an <|endoftext|> token appended by the tokenizer.
- "pplx-embed": model_type bidirectional_pplx_qwen3 with use_bidirectional_attention, mean
  pooling, no prompts.
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


def hf_config(cfg: dict):
    """The transformers Qwen3Config for one of our config dicts (pplx's model_type mapped to qwen3)."""
    from transformers import Qwen3Config
    keep = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "use_bidirectional_attention",
                                                      "rope_theta", "rope_scaling", "torch_dtype")}
    return Qwen3Config(**keep, rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]})


def write_qwen3_folder(path: Path, *, style: str = "qwen3-embedding", seed: int = 0,
                       causal_lm: bool = False, pooling: str | None = None, **shape) -> Path:
    """Write config.json, model.safetensors (random weights, fixed seed), tokenizer.json and the
    sentence-transformers files. causal_lm=True saves the same weights under Qwen3ForCausalLM
    names ("model." prefix, plus an lm_head). Returns the folder."""
    from safetensors.torch import save_file
    from transformers import Qwen3Model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = qwen3_config_dict(style=style, **shape)
    torch.manual_seed(seed)
    model = Qwen3Model(hf_config(cfg)).eval()
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
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if style == "qwen3-embedding":
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": cfg["hidden_size"],
        "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": pooling == "lasttoken",
        "include_prompt": True}, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    prompts = {"query": QUERY_PROMPT, "document": ""} if style == "qwen3-embedding" else {}
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))
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


def hf_reference_model(folder: Path):
    """transformers Qwen3Model (eager attention, float32) with the folder's weights."""
    from safetensors.torch import load_file
    from transformers import Qwen3Model

    cfg = json.loads((Path(folder) / "config.json").read_text())
    model = Qwen3Model(hf_config(cfg))
    model.config._attn_implementation = "eager"
    state = {k.removeprefix("model."): v for k, v in load_file(str(Path(folder) / "model.safetensors")).items()
             if not k.startswith("lm_head.")}
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def hf_hidden(model, ids: list[int], causal: bool) -> torch.Tensor:
    """Final hidden states [L, H] of one sequence from the HF model, causal or bidirectional.

    Qwen3Model always builds a causal mask; a precomputed mask mapping of None (no mask at all)
    gives the bidirectional attention pplx-embed's modeling.py uses, on eager attention."""
    x = torch.tensor([ids])
    mask = None if causal else {"full_attention": None}
    return model(input_ids=x, attention_mask=mask).last_hidden_state[0]


# pplx-embed-v1-0.6b (and Qwen3-Embedding-0.6B, causal) shape, for the GPU suite and benchmarks.
SHAPE_0P6B = dict(vocab_size=151669, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                  head_dim=128, intermediate_size=3072, max_position_embeddings=32768)


def qwen3_model_config(causal: bool = False, **shape):
    """A ModelConfig for a Qwen3 shape without a folder (random-weight GPU tests, benchmarks)."""
    from rose_backend.config import ModelConfig

    s = {**SHAPE_0P6B, **shape}
    return ModelConfig(
        model_dir=Path("."), model_type="qwen3", vocab_size=s["vocab_size"], hidden_size=s["hidden_size"],
        num_layers=s["num_layers"], num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"],
        head_dim=s["head_dim"], intermediate_size=s["intermediate_size"],
        max_position_embeddings=s["max_position_embeddings"], max_seq_length=s["max_position_embeddings"],
        norm_eps=1e-6, hidden_act="silu", rope_theta=1_000_000.0, causal=causal,
        pooling="lasttoken" if causal else "mean")


@torch.no_grad()
def random_qwen3(cfg, device, dtype=torch.float32, seed: int = 0):
    """Qwen3Decoder with random weights made on `device` (no folder, no host copy): linear and
    embedding weights ~ N(0, 0.02), norm weights ~ N(1, 0.1)."""
    from rose_backend.models.qwen3 import Qwen3Decoder

    with torch.device("meta"):
        model = Qwen3Decoder(cfg)
    model.to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.normal_(1.0, 0.1, generator=gen)
        else:
            p.normal_(0.0, 0.02, generator=gen)
    model.rotary.init_cache()
    return model.to(dtype).eval().requires_grad_(False)


class PackedForward:
    """A model plus pooling on fixed device buffers for one ragged layout: `eager()`, or
    `capture()` once and then `replay()`. The stand-in for the engine's graph cache in the
    random-weight GPU tests and benchmarks (same backend contract: plan outside the graph,
    `graph_key` naming the fixed cu_seqlens buffer)."""

    def __init__(self, model, lens: list[int], pooling: str, graph_key=None):
        import numpy as np
        from rose_backend.layers.attention import AttentionMetadata

        dev = model.embed_tokens.weight.device
        lens_np = np.asarray(lens, dtype=np.int64)
        cu_host = torch.tensor(np.concatenate([[0], np.cumsum(lens_np)]), dtype=torch.int32)
        self.model, self.pooling = model, pooling
        self.cu = cu_host.to(dev)                                                     # [S + 1]
        self.ids = torch.zeros(int(lens_np.sum()), dtype=torch.long, device=dev)       # [T]
        self.positions = torch.cat([torch.arange(n) for n in lens]).to(dev)           # [T]
        self.seq_ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(dev)
        self.inv_lens = (1.0 / torch.tensor(lens, dtype=torch.float32))[:, None].to(dev)  # [S, 1]
        causal = model.cfg.causal
        self.eager_meta = AttentionMetadata(self.cu, int(lens_np.max()), list(lens), causal, cu_seqlens_host=cu_host)
        self.graph_meta = AttentionMetadata(self.cu, int(lens_np.max()), list(lens), causal,
                                            graph_key=graph_key or ("packed", tuple(lens)), cu_seqlens_host=cu_host)
        self.graph, self.out = None, None

    def _forward(self) -> torch.Tensor:
        from rose_backend.models.pooling import pool
        hidden = self.model(self.ids, self.positions)                                  # [T, H]
        return pool(hidden, self.cu, self.seq_ids, self.inv_lens, self.pooling)         # [S, H] float32

    @torch.inference_mode()
    def eager(self, plan: bool = True) -> torch.Tensor:
        if plan:
            self.model.attn.plan(self.eager_meta)
        return self._forward()

    @torch.inference_mode()
    def capture(self) -> None:
        self.model.attn.plan(self.graph_meta)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                       # warm-up: JIT, workspaces, allocator
            self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._forward()

    @torch.inference_mode()
    def replay(self, plan: bool = True) -> torch.Tensor:
        if plan:
            self.model.attn.plan(self.graph_meta)
        self.graph.replay()
        return self.out
