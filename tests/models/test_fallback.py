"""The fallback engine (transformers' own model for families without a native file) against
sentence-transformers on tiny random folders of such families (float32, 1 - cos <= 1e-5), eager and
through the bucketed static path (CPU stand-in graphs, captured and replayed), with batches cut into
several micro-batches; which engine a folder gets and why; remote code only with the opt-in."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rose_backend.config import ModelConfig, ModelFolderError
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.choice import check_engine, engine_choice, startup_line
from rose_backend.engine.factory import build_engine
from rose_backend.engine.fallback import FallbackEngine
from rose_backend.engine.options import EngineOptions
from rose_testing.compare import cos_dist
from rose_testing.fallback_folders import fallback_folder, remote_code_folder
from rose_testing.folders import random_ids
from rose_testing.st_folders import Dense, chain_folder, words

LENGTHS = (1, 9, 33, 128, 4, 70, 2, 17)
SMALL = dict(max_tokens=64, max_seqs=4)       # several micro-batches per batch


def st_model(folder, **kw):
    import torch
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch.float32}, **kw)


def sequences(lengths=LENGTHS, seed=1):
    rng = np.random.default_rng(seed)
    return [random_ids(rng, 1000, n).tolist() for n in lengths]


@pytest.mark.parametrize("model_type,pooling,dense,normalize", [
    ("electra", ("mean",), [], True),
    ("deberta-v2", ("cls", "max"), [], False),
    ("t5", ("mean",), [Dense(48, "Identity", bias=False)], True),       # sentence-t5's chain
    ("gpt2", ("lasttoken",), [Dense(32, "Tanh")], True),                # a causal decoder
])
def test_fallback_families_match_sentence_transformers(tmp_path, model_type, pooling, dense, normalize):
    base = fallback_folder(model_type, tmp_path / "base")
    folder = chain_folder(tmp_path / "m", transformer=base, pooling=pooling, dense=dense, normalize=normalize)
    cfg = ModelConfig.from_folder(folder)
    choice = engine_choice(cfg)
    assert not choice.native and choice.why == f"no native model file for model_type {model_type!r}: transformers runs it"
    seqs = sequences()
    ref = st_model(folder).encode([words(s) for s in seqs], batch_size=len(seqs))
    for graphs in (False, True):
        engine, _ = build_engine(cfg, "cpu", EngineOptions(graphs=graphs, **SMALL))
        assert isinstance(engine, FallbackEngine) and engine.embedding_dim == ref.shape[1]
        for _ in range(3):                                 # eager, then (graphs) captured, then replayed
            ours = engine.embed(seqs)
            assert cos_dist(ours, ref).max() <= 1e-5, (graphs, cos_dist(ours, ref))
        alone = np.concatenate([engine.embed([s]) for s in seqs])
        assert cos_dist(alone, ref).max() <= 1e-5
        st = engine.stats
        assert st.batches == 3 + len(seqs) and st.sequences == 4 * len(seqs)
        if graphs:
            assert st.graph_captures > 0 and st.graph_replays > 0
        else:
            assert st.graph_captures == 0 and st.eager_runs > 3                # micro-batches, not batches


def test_hidden_states_for_late_chunking_are_the_models_token_embeddings(tmp_path):
    folder = chain_folder(tmp_path / "m", transformer=fallback_folder("electra", tmp_path / "base"))
    engine = FallbackEngine(ModelConfig.from_folder(folder), options=EngineOptions(**SMALL))
    seqs = sequences((5, 40, 3))
    lt = engine.step(PackedBatch(np.concatenate(seqs).astype(np.int32), np.array([len(s) for s in seqs], np.int32),
                                 frozenset({"hidden"})))
    lt.synchronize()
    tokens = st_model(folder).encode([words(s) for s in seqs], output_value="token_embeddings")
    np.testing.assert_allclose(lt.extras["hidden"], np.concatenate([t.numpy() for t in tokens]), atol=1e-5)


def test_which_engine_and_the_start_up_line(tmp_path, default_model_dir):
    cfg = ModelConfig.from_folder(default_model_dir)
    choice = engine_choice(cfg)
    assert choice.native and choice.why == "models/bert.py serves model_type 'bert'"
    line = startup_line(cfg, choice, "float32", "cpu")
    assert line == (f"rose: {default_model_dir}: family bert, engine native (models/bert.py serves model_type "
                    "'bert'), chain Transformer -> Pooling(mean) -> Normalize, 384-dim output, dtype float32, "
                    "max length 256 tokens, on cpu")
    folder = chain_folder(tmp_path / "m", transformer=fallback_folder("t5", tmp_path / "base"),
                          dense=[Dense(48, "Identity", bias=False)])
    cfg = ModelConfig.from_folder(folder)
    assert "family t5, engine fallback (no native model file for model_type 't5': transformers runs it), chain " \
           "Transformer -> Pooling(mean) -> Dense(64->48, no bias) -> Normalize, 48-dim output" in \
           startup_line(cfg, engine_choice(cfg), "float32", "cpu")


def test_the_fallback_has_no_query_lane(tmp_path):
    from rose_backend.triton.engine_options import query_engine_for
    folder = chain_folder(tmp_path / "m", transformer=fallback_folder("electra", tmp_path / "base"))
    main = FallbackEngine(ModelConfig.from_folder(folder))
    warned = []
    assert query_engine_for("auto", main, main.options, warned.append) is None and not warned   # CPU: none anyway
    with pytest.raises(ValueError, match="fallback engine, which has no query lane"):
        query_engine_for("on", main, main.options, warned.append)
    with pytest.raises(ValueError, match="no FP8 and no attention backend"):
        FallbackEngine(main.cfg, options=EngineOptions(attention="sdpa_loop"))


def test_remote_code_runs_only_with_the_opt_in(tmp_path):
    folder = chain_folder(tmp_path / "m", transformer=remote_code_folder(tmp_path / "base"), pooling=("mean",),
                          dense=[Dense(24, "Tanh")])
    cfg = ModelConfig.from_folder(folder)
    choice = engine_choice(cfg)
    assert not choice.native and choice.remote_code == ("modeling_tiny.py",)
    for refuse in (lambda: build_engine(cfg, "cpu"), lambda: check_engine(str(folder), None, {})):
        with pytest.raises(ModelFolderError) as e:
            refuse()
        assert "modeling_tiny.py" in str(e.value) and "trust_remote_code=true" in str(e.value)
        assert "TRUST_REMOTE_CODE=1" in str(e.value)
    assert not check_engine(str(folder), None, {"ROSE_TRUST_REMOTE_CODE": "1"}).native
    engine, _ = build_engine(cfg, "cpu", EngineOptions(**SMALL), trust_remote_code=True)
    seqs = sequences((3, 50, 7, 1))
    ref = st_model(folder, trust_remote_code=True).encode([words(s) for s in seqs])
    assert ref.shape == (4, 24)
    assert cos_dist(engine.embed(seqs), ref).max() <= 1e-5


def test_remote_code_outside_the_folder_is_refused_even_when_trusted(tmp_path):
    folder = remote_code_folder(tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    raw["auto_map"]["AutoModel"] = "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelFolderError, match="code in another repository .*nomic-ai/nomic-bert-2048"):
        build_engine(ModelConfig.from_folder(folder), "cpu", trust_remote_code=True)
    raw["auto_map"]["AutoModel"] = "modeling_gone.TinyModel"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelFolderError, match="names modeling_gone.py, which the folder does not hold"):
        build_engine(ModelConfig.from_folder(folder), "cpu", trust_remote_code=True)


def test_a_native_type_with_its_own_code_is_that_code(tmp_path, default_model_dir):
    """jina-v2 / jina-v3 style: model_type bert or xlm-roberta, but auto_map's AutoModel is the folder's
    own code, which is what sentence-transformers (trust_remote_code=True) runs: not the native file."""
    import shutil
    folder = tmp_path / "m"
    shutil.copytree(default_model_dir, folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "auto_map": {"AutoModel": "modeling_bert_own.BertModel"}}))
    choice = engine_choice(ModelConfig.from_folder(folder))
    assert not choice.native and choice.remote_code == ("modeling_bert_own.py",)


def test_fallback_budget_and_weights_that_do_not_match(tmp_path):
    from rose_backend.engine.memory_budget import MemoryBudgetExceeded
    from safetensors.torch import load_file, save_file
    folder = chain_folder(tmp_path / "m", transformer=fallback_folder("electra", tmp_path / "base"))
    cfg = ModelConfig.from_folder(folder)
    engine = FallbackEngine(cfg)
    assert engine.budget.weights > 1000 * 32 * 4 and engine.budget.activations > 0
    with pytest.raises(MemoryBudgetExceeded, match="weights"):
        FallbackEngine(cfg, options=EngineOptions(memory_limit_bytes=engine.budget.total - 1))
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "layer.1." not in k}, str(folder / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="the weights lack .* tensors"):
        FallbackEngine(cfg)
