"""The native families (rose_backend/models) against transformers on random-weight folders.

Each family's tiny shape (rose_testing.folders SHAPES "tiny-*", written with transformers itself) runs
one ragged batch through the engine in float32 and is compared with transformers run one sequence at a
time (1 - cos <= 1e-5): lengths from 1 to max_seq_length, several longer than the family's sliding
window; the rows must not depend on the batch around them. Config reading (family, attention mode,
default pooling, windows) is checked against what transformers' own classes read.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.models.registry import attention_shape
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder, random_ids
from rose_testing.reference import Reference

TOL = 1e-5
LENGTHS = (1, 7, 40, 3, 23, 17)
# shape -> (family, causal, pooling, the attention shape's windows: None is full attention)
FAMILIES = {
    "tiny-camembert": ("bert", False, "mean", (None,)),
    "tiny-distilbert": ("distilbert", False, "cls", (None,)),
    "tiny-mpnet": ("mpnet", False, "mean", (None,)),
    "tiny-modernbert": ("modernbert", False, "cls", (None, (8, 8))),           # local_attention 16
    "tiny-gemma3": ("gemma3", False, "mean", ((8, 8), None)),                  # sliding_window 16, bidirectional
    "tiny-qwen2": ("llama", True, "lasttoken", (None, (11, 0))),               # sliding_window 12 from layer 1
    "tiny-mistral": ("llama", True, "lasttoken", ((15, 0),)),                  # every layer, sliding_window 16
    "tiny-llama": ("llama", False, "mean", (None,)),                           # is_causal false, llama3 RoPE
}


@pytest.fixture(scope="module")
def folder_of(tmp_path_factory):
    cache = {}

    def make(shape: str, **config):
        key = (shape, tuple(sorted(config.items())))
        if key not in cache:
            cache[key] = make_folder(shape, tmp_path_factory.mktemp(shape), **config)
        return cache[key]
    return make


@pytest.mark.parametrize("shape", FAMILIES)
def test_family_matches_transformers(folder_of, shape):
    family, causal, pooling, windows = FAMILIES[shape]
    folder = folder_of(shape)
    cfg = ModelConfig.from_folder(folder)
    assert (cfg.family, cfg.causal, cfg.pooling) == (family, causal, pooling)
    assert attention_shape(cfg, torch.float32).windows == windows
    rng = np.random.default_rng(1)
    seqs = [random_ids(rng, cfg.vocab_size, n).tolist() for n in (*LENGTHS, cfg.max_seq_length)]
    engine = Engine(cfg)
    ours = engine.embed(seqs)                                      # one ragged batch
    ref = Reference(folder).embed(seqs)                            # transformers, one sequence at a time
    assert cos_dist(ours, ref).max() <= TOL, cos_dist(ours, ref)
    if cfg.normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # batch composition must not change a row: alone, and in another batch in another order
    alone = np.concatenate([engine.embed([s]) for s in seqs])
    np.testing.assert_allclose(ours, alone, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours[::-1], engine.embed(seqs[::-1]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", ["tiny-modernbert", "tiny-gemma3", "tiny-qwen2", "tiny-mistral", "tiny-mpnet"])
def test_windows_and_bias_are_what_is_compared(folder_of, shape):
    """The comparison above can fail on a wrong window or position bias: with the window off (the
    bias zeroed for MPNet) a sequence longer than the window moves well past TOL, a shorter one not."""
    cfg = ModelConfig.from_folder(folder_of(shape))
    rng = np.random.default_rng(2)
    short, long = (random_ids(rng, cfg.vocab_size, n).tolist() for n in (8, 120))
    served, changed = Engine(cfg), Engine(cfg)
    for module in changed.model.modules():
        if getattr(module, "window", None) is not None:
            module.window = None
    if shape == "tiny-mpnet":
        changed.model.relative_attention_bias.weight.data.zero_()
    else:
        assert cos_dist(served.embed([short]), changed.embed([short])).max() <= 1e-6
    assert cos_dist(served.embed([long]), changed.embed([long])).max() > 100 * TOL


@pytest.mark.parametrize("shape, changes, pooling", [
    ("tiny-mistral", {"is_causal": False}, "mean"),                # bidirectional decoder: mean
    ("tiny-qwen2", {}, "lasttoken"),                               # causal decoder: last token
    ("tiny-mpnet", {}, "cls"),                                     # encoder: CLS
])
def test_default_pooling_without_a_pooling_config(folder_of, tmp_path, shape, changes, pooling):
    import json
    import shutil
    dst = tmp_path / "m"
    shutil.copytree(folder_of(shape), dst)
    (dst / "modules.json").unlink()
    raw = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**raw, **changes}))
    assert ModelConfig.from_folder(dst).pooling == pooling
