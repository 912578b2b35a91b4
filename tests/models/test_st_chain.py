"""The sentence-transformers chain (Pooling modes, Dense, Normalize) at the engine, against
sentence-transformers' own SentenceTransformer(folder).encode on the same random-weight folder
(float32, 1 - cos <= 1e-5), eager and through the bucketed static path (CPU stand-in graphs); the
modules rose does not serve refused at start by name; prompts and DIMENSIONS as sentence-transformers
applies them."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rose_backend.config import ModelConfig, ModelFolderError
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder, random_ids
from rose_testing.st_folders import Dense, chain_folder, saved_by_sentence_transformers, words

LENGTHS = (1, 5, 17, 64, 3, 40)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """A tiny random BERT (no chain files of its own that matter: chain_folder rewrites them)."""
    return make_folder("tiny-bert", tmp_path_factory.mktemp("bert") / "m", num_hidden_layers=1)


def st_encode(folder, texts, **kw) -> np.ndarray:
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch.float32})
    return model.encode(texts, batch_size=len(texts), **kw)


def sequences(n_vocab=1000, lengths=LENGTHS, seed=1):
    rng = np.random.default_rng(seed)
    return [random_ids(rng, n_vocab, n).tolist() for n in lengths]


def check(folder, graphs: bool = False, expect_dim: int | None = None):
    """rose's engine against sentence-transformers on `folder`, eager and (graphs) bucketed."""
    cfg = ModelConfig.from_folder(folder)
    seqs = sequences(cfg.vocab_size)
    ref = st_encode(folder, [words(s) for s in seqs])
    assert cfg.embedding_dim == ref.shape[1] == (expect_dim or ref.shape[1])
    for g in (False, True) if graphs else (False,):
        ours = Engine(cfg, options=EngineOptions(graphs=g)).embed(seqs)
        assert ours.shape == ref.shape
        assert np.isfinite(ours).all()
        assert cos_dist(ours, ref).max() <= 1e-5, (g, cos_dist(ours, ref))
        np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-5)
    return cfg


@pytest.mark.parametrize("mode", ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"])
def test_each_pooling_mode_matches_sentence_transformers(tmp_path, transformer, mode):
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=(mode,), normalize=mode != "max")
    cfg = check(folder, graphs=True, expect_dim=64)
    assert cfg.pooling == mode and cfg.normalize == (mode != "max")
    assert cfg.chain.late_chunking_refusal() is None


@pytest.mark.parametrize("pooling,legacy", [(("cls", "mean"), False), (("mean", "max", "weightedmean"), False),
                                            (("cls", "max", "mean", "mean_sqrt_len_tokens"), True),
                                            (("weightedmean", "lasttoken"), True)])
def test_concatenated_modes_in_sentence_transformers_order(tmp_path, transformer, pooling, legacy):
    """A list of modes concatenates in the order given; the legacy flags in cls, max, mean,
    mean_sqrt_len_tokens, weightedmean, lasttoken order, whatever order the file lists them in."""
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=pooling, legacy=legacy)
    cfg = check(folder, graphs=True, expect_dim=64 * len(pooling))
    assert cfg.pooling == "+".join(pooling)


def test_legacy_flags_none_set_mean_as_sentence_transformers(tmp_path, transformer):
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("mean",), legacy=True)
    cfg_path = folder / "1_Pooling" / "config.json"
    cfg_path.write_text(json.dumps({k: False if k.startswith("pooling_mode") else v
                                    for k, v in json.loads(cfg_path.read_text()).items()}))
    assert check(folder).pooling == "mean"


@pytest.mark.parametrize("dense,normalize,legacy", [
    ([Dense(48, "Tanh")], True, True),                                     # LaBSE-style: Dense(tanh) then Normalize
    ([Dense(128, "Identity", bias=False), Dense(48, "Identity", bias=False)], True, False),   # EmbeddingGemma's two
    ([Dense(32, None)], False, True),                                      # no activation key: Tanh, its default
    ([Dense(64, "GELU", residual=True)], True, False),                     # residual, same width
    ([Dense(40, "SiLU", residual=True), Dense(24, "ReLU")], False, False),  # residual through its own linear
])
def test_dense_variants_match_sentence_transformers(tmp_path, transformer, dense, normalize, legacy):
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("mean",), dense=dense,
                          normalize=normalize, legacy=legacy)
    cfg = check(folder, graphs=True, expect_dim=dense[-1].out_features)
    assert cfg.normalize == normalize
    assert "late chunking" in cfg.chain.late_chunking_refusal()       # a chunk's mean is not this chain's output
    assert cfg.chain.describe().startswith("Transformer -> Pooling(mean) -> Dense(64->")


def test_the_gateway_knows_the_chains_width(tmp_path, transformer):
    from rose_gateway.tokens import ModelInfo
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("cls", "mean"), dense=[Dense(40)])
    info = ModelInfo(folder)
    assert (info.dimensions, info.normalizes) == (40, True)


def test_dense_before_normalize_then_dense(tmp_path, transformer):
    """Modules run in the folder's order: Normalize between two Dense modules (the output then is not
    unit length, so DIMENSIONS does not normalize it again)."""
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("cls",), dense=[Dense(32, "Tanh")])
    modules = json.loads((folder / "modules.json").read_text())
    from rose_testing.st_folders import NEW_TYPES, write_dense
    write_dense(folder / "4_Dense", 32, Dense(16, "Identity"), np.random.default_rng(5))
    modules.append({"idx": 4, "name": "4", "path": "4_Dense", "type": NEW_TYPES["Dense"]})
    (folder / "modules.json").write_text(json.dumps(modules))
    cfg = check(folder, expect_dim=16)
    assert not cfg.normalize
    assert cfg.chain.describe() == ("Transformer -> Pooling(cls) -> Dense(64->32, tanh) -> Normalize -> "
                                    "Dense(32->16)")


def test_a_folder_saved_by_sentence_transformers(tmp_path, transformer):
    folder = saved_by_sentence_transformers(tmp_path / "st", transformer, ("cls", "mean"),
                                            [Dense(32, "Tanh"), Dense(16, "Identity", bias=False)])
    cfg = check(folder, graphs=True, expect_dim=16)
    assert cfg.chain.describe() == ("Transformer -> Pooling(cls+mean) -> Dense(128->32, tanh) -> "
                                    "Dense(32->16, no bias) -> Normalize")


def test_prompts_of_config_sentence_transformers(tmp_path, transformer):
    """EmbeddingGemma-style prompts (a name per task, none by default) put before the text as
    sentence-transformers' encode(prompt_name=...) puts them, through the tokenizer tier's code."""
    from rose_ensemble.tokenization import TextTokenizer
    prompts = {"query": "w7 w8 w9 ", "document": "w11 w12 "}
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("mean",),
                          dense=[Dense(96, "Identity", bias=False), Dense(64, "Identity", bias=False)], prompts=prompts)
    cfg = ModelConfig.from_folder(folder)
    assert cfg.prompts == prompts and cfg.default_prompt_name is None
    tok = TextTokenizer.from_folder(folder)
    texts = [words(s) for s in sequences(lengths=(3, 9, 20))]
    engine = Engine(cfg)
    for name in ("query", "document", None):
        prompt = tok.prompt_for(name)
        ids = [e.ids for e in tok.encode_batch([prompt + t for t in texts])]
        ref = st_encode(folder, texts, prompt_name=name)
        assert cos_dist(engine.embed(ids), ref).max() <= 1e-5, name


@pytest.mark.parametrize("normalize", [True, False])
def test_dimensions_cut_after_the_whole_chain(tmp_path, transformer, normalize):
    """DIMENSIONS d: the first d of the chain's output (after Dense and Normalize), normalized again when
    the chain ends with Normalize: sentence-transformers' encode(truncate_dim=d) with
    normalize_embeddings=True for such a model, plain truncate_dim otherwise."""
    from rose_backend.serving.outputs import OutputOptions, dense_output
    folder = chain_folder(tmp_path / "m", transformer=transformer, pooling=("mean",),
                          dense=[Dense(48, "Identity", bias=False)], normalize=normalize)
    cfg = ModelConfig.from_folder(folder)
    seqs = sequences(lengths=(4, 11, 30))
    emb = Engine(cfg).embed(seqs)
    for d in (8, 24):
        ours = dense_output(emb, OutputOptions(frozenset({"EMBEDDINGS"}), frozenset(), d), cfg.normalize, None)
        ref = st_encode(folder, [words(s) for s in seqs], truncate_dim=d, normalize_embeddings=normalize)
        assert ours.shape == ref.shape == (3, d)
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-6)


def _modules(folder):
    return json.loads((folder / "modules.json").read_text())


def _refused(folder, *needles):
    with pytest.raises(ModelFolderError) as e:
        ModelConfig.from_folder(folder)
    for n in needles:
        assert n in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("module_type,name", [
    ("sentence_transformers.models.LayerNorm", "LayerNorm"),
    ("sentence_transformers.models.CNN", "CNN"),
    ("sentence_transformers.models.LSTM", "LSTM"),
    ("sentence_transformers.base.modules.router.Router", "Router"),
    ("sentence_transformers.models.Asym", "Asym"),
])
def test_a_module_rose_does_not_implement_is_refused_by_name(tmp_path, transformer, module_type, name):
    folder = chain_folder(tmp_path / "m", transformer=transformer)
    modules = _modules(folder)
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_X", "type": module_type})
    for i, m in enumerate(modules):
        m["idx"] = i
    (folder / "modules.json").write_text(json.dumps(modules))
    _refused(folder, f"module {name} ({module_type}", "not implemented by rose")


def test_custom_modules_and_token_level_modules_are_refused(tmp_path, transformer):
    folder = chain_folder(tmp_path / "m", transformer=transformer, dense=[Dense(32)])
    modules = _modules(folder)
    (folder / "modules.json").write_text(json.dumps(modules[:2] + [{"idx": 2, "name": "2", "path": "2_Dense",
                                                                  "type": "my_package.MyProjection"}]))
    _refused(folder, "'my_package.MyProjection'", "custom module type")
    weighted = [modules[0], {"idx": 1, "name": "1", "path": "1_W", "type": "sentence_transformers.models.WeightedLayerPooling"}]
    (folder / "modules.json").write_text(json.dumps(weighted + modules[1:]))
    _refused(folder, "WeightedLayerPooling")
    (folder / "modules.json").write_text(json.dumps(modules))
    dense_cfg = folder / "2_Dense" / "config.json"
    cfg = json.loads(dense_cfg.read_text())
    dense_cfg.write_text(json.dumps({**cfg, "module_input_name": "token_embeddings"}))
    _refused(folder, "module_input_name is 'token_embeddings'", "sentence embedding only")
    dense_cfg.write_text(json.dumps({**cfg, "activation_function": "my_package.Swish"}))
    _refused(folder, "'my_package.Swish'", "not a torch.nn module")
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    _refused(folder, "no Pooling module")
    (folder / "modules.json").write_text(json.dumps(modules))
    dense_cfg.write_text(json.dumps(cfg))
    assert ModelConfig.from_folder(folder).embedding_dim == 32
    (folder / "sentence_bert_config.json").write_text(json.dumps({"transformer_task": "fill-mask"}))
    _refused(folder, "transformer_task is 'fill-mask'")


def test_include_prompt_false_is_refused_by_name(tmp_path, transformer):
    folder = chain_folder(tmp_path / "m", transformer=transformer)
    path = folder / "1_Pooling" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "include_prompt": False}))
    _refused(folder, "include_prompt is false", str(path))


def test_pickled_dense_weights_are_refused_with_the_conversion(tmp_path, transformer):
    import torch
    folder = chain_folder(tmp_path / "m", transformer=transformer, dense=[Dense(32)])
    sub = folder / "2_Dense"
    from safetensors.torch import load_file
    torch.save(load_file(str(sub / "model.safetensors")), sub / "pytorch_model.bin")
    (sub / "model.safetensors").unlink()
    msg = _refused(folder, "pytorch_model.bin (pickle)", "safetensors only", "save_file(torch.load(")
    command = msg.split("Convert them: ")[1]
    assert command.startswith("python -c ")
    import shlex
    import subprocess
    import sys
    subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True)     # the command given works
    check(folder, expect_dim=32)


def test_do_lower_case_needs_a_lowercasing_tokenizer(tmp_path, transformer):
    folder = chain_folder(tmp_path / "m", transformer=transformer)
    sb = folder / "sentence_bert_config.json"
    sb.write_text(json.dumps({**json.loads(sb.read_text()), "do_lower_case": True}))
    msg = _refused(folder, "do_lower_case", "n.Lowercase()")
    import shlex
    import subprocess
    import sys
    subprocess.run([sys.executable, *shlex.split(msg.split("Add the lowercasing to it: ")[1])[1:]], check=True)
    assert ModelConfig.from_folder(folder).pooling == "mean"
    texts = ["W5 w6 W70", "w9"]
    from rose_ensemble.tokenization import TextTokenizer
    ids = [e.ids for e in TextTokenizer.from_folder(folder).encode_batch(texts)]
    assert ids == [[5, 6, 70], [9]]
    assert cos_dist(Engine(ModelConfig.from_folder(folder)).embed(ids), st_encode(folder, texts)).max() <= 1e-5
