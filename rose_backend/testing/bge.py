"""Model folders for the GPU suite and the benchmarks: a BGE-M3-shaped random XLM-R, and the
float32 Hugging Face reference of any folder. The weights are rounded to bf16 once, so the engine
(bf16) and the reference (float32) hold the same numbers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


BGE_M3 = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
              intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
              layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
              hidden_act="gelu", model_type="xlm-roberta", architectures=["XLMRobertaModel"])


def make_bge_m3_folder(path: str | Path, layers: int | None = None, seed: int = 0) -> Path:
    """Write a random BGE-M3-shaped model folder (CLS pooling + normalize, like BGE-M3)."""
    from safetensors.torch import save_file
    from transformers import XLMRobertaConfig, XLMRobertaModel
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    conf = dict(BGE_M3)
    if layers:
        conf["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    with torch.device("cuda"):
        m = XLMRobertaModel(XLMRobertaConfig(**conf), add_pooling_layer=False)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in m.state_dict().items()}
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(conf))
    (path / "tokenizer.json").write_text("{}")            # the engine never reads it
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))
    return path


class HFReference:
    """float32 Hugging Face AutoModel of a folder; embeds one sequence at a time, unpadded."""

    def __init__(self, cfg, device="cuda"):
        from transformers import AutoModel
        self.cfg = cfg
        self.model = AutoModel.from_pretrained(str(cfg.model_dir), dtype=torch.float32,
                                               add_pooling_layer=False).to(device).eval()
        self.device = device

    @torch.inference_mode()
    def embed(self, token_lists) -> torch.Tensor:
        out = []
        for ids in token_lists:
            x = torch.tensor([list(ids)], device=self.device)
            h = self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
            e = h[0] if self.cfg.pooling == "cls" else h.mean(0)
            out.append(torch.nn.functional.normalize(e, dim=-1) if self.cfg.normalize else e)
        return torch.stack(out).float().cpu()
