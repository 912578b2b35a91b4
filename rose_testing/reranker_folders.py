"""Random-weight reranker folders (cross-encoders, Qwen3-Reranker) and their reference scores.

    folder = write_reranker_folder("tiny-xlmr-ce", tmp / "xlmr")     # see SHAPES
    ref = reference_scores(folder, "query", ["doc a", "doc b"])       # np.float32 [n]

Folders are written with transformers' save_pretrained (safetensors), so they are what a hub
download of the same architecture holds. Tokenizers:
- BERT cross-encoders reuse the default model's (all-MiniLM-L6-v2) BERT tokenizer files, which are
  real: WordPiece, lower-casing, `[CLS] q [SEP] d [SEP]` with segment ids 0 / 1.
- The other cross-encoders (XLM-R, MPNet, DistilBERT, ModernBERT) and Qwen3-Rerankers get a WordLevel
  tokenizer over words "w{i}" (word i is token i), so any length is easy to make; the encoders' has
  RoBERTa's pair template `<s> q </s></s> d </s>`, the Qwen3 one the chat tokens of the Qwen3-Reranker
  prompt and "yes"/"no".
References: sentence-transformers' CrossEncoder.predict (its default activation) for
cross-encoders, the Qwen3-Reranker model card's code on transformers' Qwen3ForCausalLM otherwise.
torch / transformers are imported inside the functions.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")                       # ids 0..3, as in XLM-R
QWEN3_SPECIALS = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "no", "yes")

_XLMR = dict(model_type="xlm-roberta", architectures=["XLMRobertaForSequenceClassification"], type_vocab_size=1,
             layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_act="gelu", num_labels=1)
_BERT = dict(model_type="bert", architectures=["BertForSequenceClassification"], type_vocab_size=2,
             layer_norm_eps=1e-12, pad_token_id=0, hidden_act="gelu", num_labels=1, vocab_size=30522)
_QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], rms_norm_eps=1e-6, hidden_act="silu",
              rope_theta=1_000_000.0, attention_bias=False, tie_word_embeddings=True, use_sliding_window=False,
              pad_token_id=1, bos_token_id=1, eos_token_id=1)

_ENC_CE = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               initializer_range=0.2, num_labels=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)

# name -> (config.json, max_seq_length written to the tokenizer config)
SHAPES: dict[str, tuple[dict, int]] = {
    "tiny-xlmr-ce": (dict(_XLMR, vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=130, initializer_range=0.2), 128),
    "tiny-bert-ce": (dict(_BERT, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, initializer_range=0.2), 128),
    "tiny-qwen3-reranker": (dict(_QWEN3, vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                 max_position_embeddings=512, initializer_range=0.2), 256),
    # The native encoder families' classification heads (tests/models/test_families_rerank.py).
    "tiny-mpnet-ce": (dict(_ENC_CE, model_type="mpnet", architectures=["MPNetForSequenceClassification"],
                           max_position_embeddings=130, layer_norm_eps=1e-5), 128),
    "tiny-distilbert-ce": (dict(model_type="distilbert", architectures=["DistilBertForSequenceClassification"],
                                vocab_size=1000, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128,
                                pad_token_id=1, initializer_range=0.2, num_labels=1), 128),
    "tiny-modernbert-ce": (dict(_ENC_CE, model_type="modernbert", architectures=["ModernBertForSequenceClassification"],
                                num_hidden_layers=3, max_position_embeddings=512, global_attn_every_n_layers=2,
                                local_attention=16, cls_token_id=0, sep_token_id=2), 256),
    # The GPU suite's and the benchmark's shapes (random weights, rounded to bf16).
    "bge-reranker-v2-m3": (dict(_XLMR, vocab_size=250002, hidden_size=1024, num_hidden_layers=24,
                                num_attention_heads=16, intermediate_size=4096, max_position_embeddings=8194), 8192),
    "qwen3-reranker-0.6b": (dict(_QWEN3, vocab_size=151669, hidden_size=1024, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                                 max_position_embeddings=40960), 8192),
}


def write_reranker_folder(name: str, path: str | Path, device: str = "cpu", seed: int = 0,
                          dtype: str | None = None) -> Path:
    """Write a random-weight reranker folder of shape `name` (SHAPES) unless one is there already.
    dtype: "bfloat16" rounds the weights once (GPU shapes default to it), else float32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config, max_len = SHAPES[name]
    path = Path(path)
    if (path / "config.json").exists() and list(path.glob("*.safetensors")):
        return path
    path.mkdir(parents=True, exist_ok=True)
    dtype = dtype or ("float32" if name.startswith("tiny") else "bfloat16")
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    if config["model_type"] == "qwen3":               # transformers 5 reads RoPE from rope_parameters
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta")}
    hf_config = AutoConfig.for_model(config["model_type"], architectures=config["architectures"], **kwargs)
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if config["model_type"] == "qwen3" else AutoModelForSequenceClassification
    with torch.device(device):
        model = auto.from_config(hf_config).eval()
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():                         # norms away from 1 so that their weights are tested too
            for pname, p in model.named_parameters():
                if pname.endswith(("norm.weight", "LayerNorm.weight")):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=device))
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    del model
    if config["model_type"] == "bert":
        _copy_bert_tokenizer(path, max_len)
    else:
        _write_word_tokenizer(path, config["vocab_size"], max_len, qwen3=config["model_type"] == "qwen3")
    if config["model_type"] == "qwen3":               # how Qwen/Qwen3-Reranker-* mark themselves
        (path / "README.md").write_text("---\nlicense: apache-2.0\npipeline_tag: text-ranking\n---\n"
                                        f"# random-weight {name}\n")
    return path


def _copy_bert_tokenizer(path: Path, max_len: int) -> None:
    from rose_backend.config import default_model_dir
    src = default_model_dir()
    for f in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, path / f)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = max_len
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def _write_word_tokenizer(path: Path, vocab_size: int, max_len: int, qwen3: bool) -> None:
    """WordLevel over "w{i}" (word i = token i) after the special tokens; pair template for XLM-R."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = QWEN3_SPECIALS if qwen3 else XLMR_SPECIALS
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    unk = "<unk>"
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if qwen3:
        tok.add_special_tokens([t for t in specials if t not in ("no", "yes")])
        extra = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": unk}
    else:
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        tok.add_special_tokens(list(specials))
        extra = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                 "pad_token": "<pad>", "unk_token": unk}
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, **extra}))


def words(rng: np.random.Generator, n: int, vocab_size: int = 1000, first: int = len(QWEN3_SPECIALS)) -> str:
    """A text of n words "w{i}" (one token each with the word tokenizers above)."""
    return " ".join(f"w{i}" for i in rng.integers(first, vocab_size, size=n))


def reference_scores(folder: str | Path, query: str, documents: list[str], instruction: str | None = None,
                     device: str = "cpu", batch_size: int = 32) -> np.ndarray:
    """What the peer library returns for the folder in float32: CrossEncoder.predict, or the
    Qwen3-Reranker model card's p(yes). float32 [n]."""
    import torch
    return PeerReranker(folder, device, torch.float32).scores(query, documents, instruction, batch_size)


class PeerReranker:
    """The peer library's reranker loaded once: sentence-transformers' CrossEncoder (its default
    activation) for cross-encoders, the Qwen3-Reranker model card's code otherwise. Also the naive
    Triton baseline of rose_bench rerank."""

    def __init__(self, folder: str | Path, device: str = "cpu", dtype=None):
        import torch
        self.folder, self.device = str(folder), device
        dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
        self.qwen3 = json.loads((Path(folder) / "config.json").read_text()).get("model_type") == "qwen3"
        if self.qwen3:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from rose_backend.model_kind import QWEN3_RERANKER_PREFIX, QWEN3_RERANKER_SUFFIX
            self.tokenizer = tok = AutoTokenizer.from_pretrained(self.folder, padding_side="left")
            self.model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=dtype).to(device).eval()
            self.no_id, self.yes_id = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
            self.prefix = tok.encode(QWEN3_RERANKER_PREFIX, add_special_tokens=False)
            self.suffix = tok.encode(QWEN3_RERANKER_SUFFIX, add_special_tokens=False)
            self.max_length = min(8192, tok.model_max_length)
        else:
            from sentence_transformers import CrossEncoder
            self.model = CrossEncoder(self.folder, device=device, model_kwargs={"dtype": dtype})

    def scores(self, query: str, documents: list[str], instruction: str | None = None,
               batch_size: int = 32) -> np.ndarray:
        if not self.qwen3:
            return np.asarray(self.model.predict([(query, d) for d in documents], batch_size=batch_size,
                                                 show_progress_bar=False), dtype=np.float32)
        out = [self._card_batch(query, documents[s:s + batch_size], instruction)
               for s in range(0, len(documents), batch_size)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)

    def _card_batch(self, query, documents, instruction) -> np.ndarray:
        """The model card's process_inputs + compute_logits (left padding, p(yes) by log_softmax)."""
        import torch

        from rose_backend.model_kind import qwen3_reranker_text
        tok = self.tokenizer
        pairs = [qwen3_reranker_text(query, d, instruction) for d in documents]
        inputs = tok(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                     max_length=self.max_length - len(self.prefix) - len(self.suffix))
        inputs["input_ids"] = [self.prefix + ids + self.suffix for ids in inputs["input_ids"]]
        inputs = tok.pad(inputs, padding=True, return_tensors="pt", max_length=self.max_length).to(self.device)
        with torch.no_grad():
            logits = self.model(**inputs).logits[:, -1, :]
        scores = torch.nn.functional.log_softmax(torch.stack([logits[:, self.no_id], logits[:, self.yes_id]], 1), dim=1)
        return scores[:, 1].exp().float().cpu().numpy()
