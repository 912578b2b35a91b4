"""FP8 projections (layers/fp8.py) on the CPU: the same arithmetic the GPU runs (e4m3 weights with
per-row scales, per-token activation scales, torch._scaled_mm), checked against float32 Hugging Face
references on random-weight folders of both families; batches below the threshold are untouched."""
import numpy as np
import pytest
import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.memory_budget import engine_budget
from rose_backend.engine.options import EngineOptions
from rose_backend.layers.fp8 import FP8, Fp8Linear, fp8_copy_bytes, quantize_linears, quantize_rows, unavailable_reason
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder
from rose_testing.reference import Reference

pytestmark = pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="this torch has no _scaled_mm")


def test_rows_quantize_to_e4m3_with_one_scale_each():
    w = torch.randn(48, 64) * torch.logspace(-2, 1, 48)[:, None]        # rows of very different ranges
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.shape == (48,)
    back = q.float() * scale[:, None]
    rel = (back - w).norm(dim=1) / w.norm(dim=1)
    assert float(rel.max()) < 0.05                                      # e4m3: 3 mantissa bits
    assert torch.allclose(back.abs().amax(dim=1), w.abs().amax(dim=1), rtol=1e-6)   # each row's max is exact


def test_fp8_linear_runs_fp8_from_its_threshold_and_the_original_below():
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    f = Fp8Linear(lin, min_tokens=8)
    small, big = torch.randn(7, 64), torch.randn(8, 64)
    assert torch.equal(f(small), lin(small))                            # below: the float weight itself
    y, want = f(big), lin(big)
    assert not torch.equal(y, want)                                     # the FP8 path ran
    assert float(cos_dist(y.detach().numpy(), want.detach().numpy()).max()) < 2e-3


def test_only_the_layers_projections_are_quantized(tmp_path):
    folder_cfg = ModelConfig.from_folder(make_folder("tiny-bert", tmp_path / "tiny-bert"))
    from rose_backend.models import build_model
    model = build_model(folder_cfg)
    n = quantize_linears(model, 16)
    assert n == 4 * folder_cfg.num_layers
    assert isinstance(model.embed_tokens, nn.Embedding)
    assert all(type(m) is not nn.Linear for layer in model.layers for m in layer.modules())


@pytest.mark.parametrize("shape", ["tiny-bert", "tiny-xlm-roberta", "tiny-qwen3"])
def test_fp8_engine_matches_the_float32_reference(tmp_path, shape):
    folder = make_folder(shape, tmp_path / shape)
    cfg = ModelConfig.from_folder(folder)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(5, cfg.vocab_size - 1, size=n).tolist() for n in (9, 31, 64, 17)]
    want = Reference(folder).embed(seqs)
    fp8 = Engine(cfg, options=EngineOptions(fp8_min_tokens=1))                  # every batch on the FP8 path
    got = fp8.embed(seqs)
    gap = cos_dist(got, want)
    assert float(gap.max()) <= 5e-3, gap                               # the README's fp8 gate
    plain = Engine(cfg).embed(seqs)
    assert float(cos_dist(plain, want).max()) < float(gap.max())       # the quantization is what it costs
    above = Engine(cfg, options=EngineOptions(fp8_min_tokens=10_000)).embed(seqs)   # threshold past the batch: unchanged
    np.testing.assert_allclose(above, plain, rtol=1e-6, atol=1e-6)


def test_the_budget_counts_the_fp8_copies(tmp_path):
    cfg = ModelConfig.from_folder(make_folder("tiny-qwen3", tmp_path / "tiny-qwen3"))
    plain = engine_budget(cfg, "cpu")
    fp8 = engine_budget(cfg, "cpu", EngineOptions(fp8_min_tokens=1))
    assert fp8.weights - plain.weights == fp8_copy_bytes(cfg) > 0
    from rose_backend.models import build_model
    model = build_model(cfg)
    quantize_linears(model, 1)
    held = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith(("w_fp8_t", "w_scale")))
    assert held == fp8_copy_bytes(cfg)


def test_a_device_without_fp8_is_refused_with_the_reason(monkeypatch):
    assert unavailable_reason("cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    why = unavailable_reason("cuda:0")
    assert "compute capability 8.9" in why and "A100" in why and "8.0" in why


def test_dtype_fp8_serves_within_the_gate_on_a_real_server(shipped_sentence_model):
    """`rose` with dtype=fp8 (and fp8_min_tokens low enough for these batches) on a tritonserver: the
    all-MiniLM-L6-v2 embeddings of real weights stay within the fp8 gate of sentence-transformers'."""
    from rose_client import EmbeddingClient
    from support.server import running_server
    texts = ["Paris is the capital of France.", "FP8 halves the bytes a weight takes.",
             "A lone query waits for nothing.", "Re-indexing runs all night."]
    with running_server(params={"rose": {"dtype": "fp8", "fp8_min_tokens": "8"}}, name="fp8", timeout=180) as srv:
        with EmbeddingClient(srv.grpc_url) as client:
            got = client.embed(texts)
        log = open(srv.log_file).read()
    want = shipped_sentence_model.encode(texts, normalize_embeddings=True)
    gap = cos_dist(got, want)
    print(f"dtype=fp8 against sentence-transformers: max 1 - cos {float(gap.max()):.2e}")
    assert float(gap.max()) <= 5e-3, gap
    assert float(gap.max()) > 1e-7, gap                                 # the FP8 path ran (float32 alone: ~1e-7)
    assert "rose: cannot start" not in log


def test_fp8_threshold_defaults_to_the_crossover_measured_for_the_family(tmp_path):
    from rose_backend.layers.fp8 import DEFAULT_MIN_TOKENS
    from rose_backend.triton.model_settings import RoseSettings
    bert = ModelConfig.from_folder(make_folder("tiny-bert", tmp_path / "bert"))
    qwen = ModelConfig.from_folder(make_folder("tiny-qwen3", tmp_path / "qwen"))
    fp8 = RoseSettings.from_values({"dtype": "fp8"})
    assert fp8.engine_fp8_min_tokens(bert) == DEFAULT_MIN_TOKENS["encoder"] == 8192
    assert fp8.engine_fp8_min_tokens(qwen) == DEFAULT_MIN_TOKENS["decoder"] == 4096
    assert RoseSettings.from_values({"dtype": "fp8", "fp8_min_tokens": "300"}).engine_fp8_min_tokens(qwen) == 300
    assert RoseSettings.from_values({"fp8_min_tokens": "300"}).engine_fp8_min_tokens(qwen) is None   # bf16: none
