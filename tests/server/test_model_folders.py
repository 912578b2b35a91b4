"""Model folders as people bring them, through a real tritonserver and the launcher: a folder with a
sentence-transformers chain (two Dense modules and Normalize, EmbeddingGemma's shape, with its
prompts) on the native engine; a folder with modeling code of its own on the fallback engine, with
the operator's opt-in; the start-up line each logs; and the first mistakes (a Hub id, no
tokenizer.json, remote code without the opt-in) answered by the launcher in one line, before any
server starts."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rose_testing.compare import cos_dist
from rose_testing.fallback_folders import remote_code_folder
from rose_testing.folders import make_folder, random_ids
from rose_testing.st_folders import Dense, chain_folder, words

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = {"query": "w7 w8 w9 ", "document": "w11 w12 "}


def st_model(folder, **kw):
    import torch
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch.float32}, **kw)


def texts(seed=3, lengths=(4, 30, 1, 12, 60)):
    rng = np.random.default_rng(seed)
    return [words(random_ids(rng, 1000, n)) for n in lengths]


def startup_lines(srv) -> list[str]:
    return [ln for ln in Path(srv.log_file).read_text().splitlines() if ": family " in ln and "engine " in ln]


@pytest.mark.server
def test_a_dense_chain_with_prompts_served_natively(shared_server, tmp_path_factory):
    from rose_client import EmbeddingClient
    base = tmp_path_factory.mktemp("gemma-like")
    folder = chain_folder(base / "m", transformer=make_folder("tiny-bert", base / "bert", num_hidden_layers=1),
                          pooling=("mean",), dense=[Dense(128, "Identity", bias=False), Dense(48, "Identity", bias=False)],
                          prompts=PROMPTS)
    srv = shared_server(None, model_dir=str(folder), name="dense-chain")
    ref_model = st_model(folder)
    batch = texts()
    with EmbeddingClient(srv.grpc_url) as client:
        for task in ("query", "document", None):
            ours = client.embed(batch, task=task)
            ref = ref_model.encode(batch, prompt_name=task)
            assert ours.shape == ref.shape == (len(batch), 48)
            assert cos_dist(ours, ref).max() <= 1e-5, task
        cut = client.embed(batch, task="query", dimensions=16)
        ref = ref_model.encode(batch, prompt_name="query", truncate_dim=16, normalize_embeddings=True)
        np.testing.assert_allclose(cut, ref, rtol=1e-4, atol=1e-5)
        with pytest.raises(Exception, match="late chunking .* is not available for this model: its chain"):
            client.embed_late_chunks([["w5 w6 ", "w7 w8"]])
    [line] = startup_lines(srv)
    assert (f"rose: {folder}: family bert, engine native (models/bert.py serves model_type 'bert'), chain "
            "Transformer -> Pooling(mean) -> Dense(64->128, no bias) -> Dense(128->48, no bias) -> Normalize, "
            "48-dim output, dtype float32, max length 512 tokens, on cpu") in line


@pytest.mark.server
def test_remote_code_served_on_the_fallback_with_the_opt_in(shared_server, tmp_path_factory):
    from rose_client import EmbeddingClient
    base = tmp_path_factory.mktemp("remote")
    folder = chain_folder(base / "m", transformer=remote_code_folder(base / "code"), pooling=("mean", "max"),
                          dense=[Dense(24, "Tanh")])
    srv = shared_server({"rose": {"trust_remote_code": "true"}}, model_dir=str(folder), name="remote-code")
    batch = texts(seed=4)
    with EmbeddingClient(srv.grpc_url) as client:
        ours = client.embed(batch)
    ref = st_model(folder, trust_remote_code=True).encode(batch)
    assert ours.shape == ref.shape == (len(batch), 24)
    assert cos_dist(ours, ref).max() <= 1e-5
    [line] = startup_lines(srv)
    assert ("family tiny_custom, engine fallback (config.json's auto_map runs the folder's own code "
            "(modeling_tiny.TinyModel)), chain Transformer -> Pooling(mean+max) -> Dense(64->24, tanh) -> "
            "Normalize, 24-dim output, dtype float32") in line


def launch(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    from support.ports import free_ports
    ports = free_ports()
    return subprocess.run([sys.executable, "-m", "rose_backend.launch", *args, "--gateway-port", "0",
                           "--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                           "--metrics-port", str(ports.metrics)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()


def test_remote_code_without_the_opt_in_is_refused_by_the_launcher(tmp_path):
    import os
    folder = remote_code_folder(tmp_path / "m")
    env = {k: v for k, v in os.environ.items() if k not in ("TRUST_REMOTE_CODE", "ROSE_TRUST_REMOTE_CODE")}
    line = one_line(launch("--model", str(folder), env=env))
    assert line.startswith(f"rose: {folder} runs its own modeling code (modeling_tiny.py, named by config.json's "
                           "auto_map), which rose runs only with the operator's opt-in: the `rose` parameter "
                           "trust_remote_code=true (make serve TRUST_REMOTE_CODE=1"), line


def test_a_hub_id_says_how_to_download_the_folder(tmp_path, monkeypatch):
    import os
    line = one_line(launch("--model", "acme/tiny-embedder", env={**os.environ, "HF_HUB_CACHE": str(tmp_path)}))
    assert line == ("rose: model folder 'acme/tiny-embedder' does not exist: MODEL takes a local folder, and Hugging "
                    "Face ids are not downloaded. Fetch the folder with `hf download acme/tiny-embedder --local-dir "
                    "models/tiny-embedder`, then serve MODEL=models/tiny-embedder.")
    from rose_backend.config import ModelFolderError, resolve_model_dir
    snapshot = tmp_path / "models--acme--tiny-embedder" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelFolderError, match=f"A copy is in the Hugging Face cache: MODEL={snapshot}$"):
        resolve_model_dir("acme/tiny-embedder")


def test_no_tokenizer_json_says_how_to_write_it(tmp_path, default_model_dir):
    from rose_backend.config import ModelConfig
    from tokenizers import Tokenizer
    folder = tmp_path / "minilm"
    shutil.copytree(default_model_dir, folder)
    (folder / "tokenizer.json").unlink()
    line = one_line(launch("--model", str(folder)))
    assert line.startswith(f"rose: {folder} has no tokenizer.json (the fast tokenizer's file, which rose tokenizes "
                           "with). Write it from the folder's own tokenizer files: python -c "), line
    command = line.split("tokenizer files: ")[1]
    subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True, cwd=tmp_path, capture_output=True)
    ModelConfig.from_folder(folder)                                 # served now
    sample = ["The capital of France is Paris.", "Grüße aus Köln", "x " * 300]
    new, old = Tokenizer.from_file(str(folder / "tokenizer.json")), Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    for tok in (new, old):                            # as rose's tokenize step uses it (no padding, its own cut)
        tok.no_padding()
        tok.no_truncation()
    assert [e.ids for e in new.encode_batch(sample)] == [e.ids for e in old.encode_batch(sample)]
