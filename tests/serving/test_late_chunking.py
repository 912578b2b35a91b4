"""Late chunking without a server: the tokenize side's plan (late_chunks.py) and rose's side (the
engine's hidden states, pooled per span as batches are collected: serving/spans.py), against
transformers (rose_testing/late_reference.py) on the default model and on random-weight
folders of both families, short documents and long ones that run in windows."""
import functools
import threading

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.serving.outputs import OutputOptions, build_outputs, collect_piece, with_token_inputs
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving.validation import RequestLimits
from rose_testing.compare import cos_dist
from rose_testing.late_reference import late_chunk_reference
from rose_ensemble.late_chunks import LateChunker, owning_window, windows
from rose_ensemble.tokenization import InputError, TextTokenizer

DENSE = OutputOptions(frozenset({"EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"}), frozenset())


def test_windows_cover_the_document_with_the_overlap():
    assert windows(10, 16, 4) == [(0, 10)]
    assert windows(10, 4, 1) == [(0, 4), (3, 7), (6, 9 + 1)]
    assert windows(11, 4, 1) == [(0, 4), (3, 7), (6, 10), (9, 11)]
    assert windows(8, 4, 0) == [(0, 4), (4, 8)]


@pytest.mark.parametrize("length, size, overlap", [(10, 4, 1), (37, 8, 3), (50, 16, 7), (9, 4, 3), (30, 6, 0)])
def test_each_token_takes_the_window_where_it_is_farthest_from_an_edge(length, size, overlap):
    spans = windows(length, size, overlap)
    owner = owning_window(length, spans)
    for j in range(length):
        dists = [(min(j - a, b - 1 - j), -w) for w, (a, b) in enumerate(spans) if a <= j < b]
        assert owner[j] == -max(dists)[1], (j, dists)
    assert np.all(np.diff(owner) >= 0)                    # owned stretches tile the document in order


@pytest.fixture(scope="module")
def minilm(default_model_dir):
    return TextTokenizer.from_folder(default_model_dir, prompts={"query": "query: "})


def test_tokens_belong_to_the_chunk_of_their_first_character(minilm, default_model_dir):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(default_model_dir))
    chunks = ["Zürich ist schö", "n. Berlin, 東京 and émigrés", " meet", " here."]
    plan = LateChunker(minilm).plan([chunks], minilm.prompt_for("query"))
    text = "query: " + "".join(chunks)
    enc = hf(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    assert plan.input_ids.tolist() == enc["input_ids"]
    ends = np.cumsum([len(c) for c in chunks]) + len("query: ")
    want = []
    for (start, _), special in zip(enc["offset_mapping"], enc["special_tokens_mask"]):
        want.append(-1 if special or start < len("query: ") else int(np.searchsorted(ends, start, side="right")))
    assert plan.token_chunks.tolist() == want
    assert plan.chunk_tokens.tolist() == [want.count(c) for c in range(len(chunks))]
    assert want[-1] == -1 and want.count(-1) > 2           # [CLS], the prompt's tokens, [SEP]


def test_a_chunk_without_a_token_of_its_own_is_named(minilm):
    chunker = LateChunker(minilm)
    with pytest.raises(InputError, match=r"TEXT\[2\] \(document 1, chunk 1\) has no token of its own"):
        chunker.plan([["one chunk"], ["Paris", "   ", " is big."]])
    with pytest.raises(InputError, match=r"TEXT\[1\] \(document 0, chunk 1\)"):
        chunker.plan([["Paris is big", ""]])


def test_doc_chunks_and_sizes_are_checked(minilm, default_model_dir):
    chunker = LateChunker(minilm)
    texts = ["a", "b", "c"]
    assert chunker.split(texts, np.array([2, 1], np.int32)) == [["a", "b"], ["c"]]
    for counts, msg in (([2, 2], "DOC_CHUNKS sum to 4 chunks but TEXT holds 3"),
                        ([3, 0], r"DOC_CHUNKS\[1\] is 0"), ([], "DOC_CHUNKS is empty")):
        with pytest.raises(InputError, match=msg):
            chunker.split(texts, np.array(counts, np.int32))
    with pytest.raises(InputError, match="must be INT32"):
        chunker.split(texts, np.array([3], np.int64))
    small = LateChunker(TextTokenizer.from_folder(default_model_dir, max_text_bytes=10))
    small.check_sizes([b"abc", b"abcdefghij"], np.array([1, 1], np.int32))        # at the limit: taken
    with pytest.raises(InputError, match=r"document 1 \(TEXT\[1:3\]\) holds 12 bytes"):
        small.check_sizes([b"abc", b"abcdef", b"abcdef"], np.array([1, 2], np.int32))


def test_overlap_must_leave_room_in_a_window(minilm, default_model_dir):
    with pytest.raises(ValueError, match="late_chunk_overlap is 256"):
        LateChunker(minilm, overlap=256)
    assert LateChunker(minilm).overlap == 64
    assert LateChunker(TextTokenizer.from_folder(default_model_dir, max_seq_length=32)).overlap == 8   # a quarter


def run_through_rose(folder, plan, max_batch_tokens=96):
    """The plan through rose's serving path in process: a service on a CPU engine, pieces collected
    as batches finish (small batches: a document's windows are split across them)."""
    cfg = ModelConfig.from_folder(folder)
    engine = Engine(cfg)
    done = threading.Event()
    service = EmbeddingService(engine, lambda r: done.set(),
                               ServiceSettings(max_batch_tokens=max_batch_tokens, max_batch_seqs=4),
                               on_piece=functools.partial(collect_piece, skip_ids=None))
    try:
        limits = RequestLimits(max_seq_len=cfg.max_positions, vocab_size=cfg.vocab_size)
        opts = with_token_inputs(DENSE, {"TOKEN_CHUNKS": plan.token_chunks}, plan.seq_lens, limits)
        r = Request(plan.input_ids, plan.seq_lens, token_outputs=opts.token_outputs, options=opts)
        service.submit(r)
        assert done.wait(120) and r.error is None, r.error
        return dict(build_outputs(r, opts, cfg.normalize, None)), engine
    finally:
        service.stop(10)


def words_document(rng, n_words, n_chunks, vocab=(4, 1000)):
    """A document of WordLevel words "w<id>" in chunks, some cut inside a word (whose token then
    belongs to the chunk before): every chunk still starts at least one word of its own."""
    words = [f"w{i}" for i in rng.integers(*vocab, size=n_words)]
    text = " ".join(words)
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
    picks = np.sort(rng.choice(np.arange(1, (n_words - 1) // 2), size=n_chunks - 1, replace=False)) * 2
    cuts = [int(starts[k]) + int(rng.integers(0, 2)) for k in picks]      # at a word, or just inside it
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def qwen3_document(rng, n_words, n_chunks):
    from rose_testing.qwen3 import WORDS
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n_words)]
    per = np.array_split(np.arange(n_words), n_chunks)
    return [" ".join(words[i] for i in part) + " " for part in per]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from rose_testing.folders import make_folder
    from rose_testing.qwen3 import write_qwen3_folder
    root = tmp_path_factory.mktemp("late-folders")
    return {"tiny-bert (mean)": make_folder("tiny-bert", root / "bert"),
            "tiny-xlm-roberta (cls)": make_folder("tiny-xlm-roberta", root / "xlmr"),
            "qwen3-embedding (last token, causal)": write_qwen3_folder(root / "qwen3", style="qwen3-embedding"),
            "pplx-embed (mean, bidirectional)": write_qwen3_folder(root / "pplx", style="pplx-embed")}


@pytest.mark.parametrize("family", ["tiny-bert (mean)", "tiny-xlm-roberta (cls)",
                                    "qwen3-embedding (last token, causal)", "pplx-embed (mean, bidirectional)"])
@pytest.mark.parametrize("long", [False, True], ids=["short", "windows"])
def test_random_weight_folders_match_transformers(folders, family, long):
    folder = folders[family]
    window, overlap = 48, 10
    tok = TextTokenizer.from_folder(folder, max_seq_length=window)
    rng = np.random.default_rng(7 + long)
    make = qwen3_document if family.startswith(("qwen3", "pplx")) else words_document
    documents = [make(rng, 150 if long else 20, 5), make(rng, 8, 2), make(rng, 90 if long else 30, 3)]
    plan = LateChunker(tok, overlap).plan(documents)
    assert (len(plan.seq_lens) > len(documents)) == long and plan.seq_lens.max() <= window
    got, _ = run_through_rose(folder, plan)
    want = np.concatenate(late_chunk_reference(folder, documents, window=window, overlap=overlap))
    assert got["EMBEDDINGS"].shape == want.shape == (10, ModelConfig.from_folder(folder).embedding_dim)
    assert cos_dist(got["EMBEDDINGS"], want).max() < 1e-5
    if ModelConfig.from_folder(folder).normalize:
        np.testing.assert_allclose(np.linalg.norm(got["EMBEDDINGS"], axis=1), 1.0, atol=1e-5)
    assert got["TOKEN_COUNTS"].tolist() == plan.chunk_tokens.tolist() and not got["TRUNCATED"].any()


@pytest.mark.parametrize("long", [False, True], ids=["short", "windows"])
def test_default_model_matches_transformers_with_a_prompt(minilm, default_model_dir, long):
    sentences = ["Paris is the capital of France. ", "It lies on the Seine, ", "and its museums are famous. ",
                 "Berlin is the capital of Germany; ", "its wall fell in 1989."]
    body = sentences * (12 if long else 1)
    documents = [body, ["A short document ", "in two chunks."]]
    plan = LateChunker(minilm, overlap=64).plan(documents, minilm.prompt_for("query"))
    assert (len(plan.seq_lens) > 2) == long
    got, engine = run_through_rose(default_model_dir, plan, max_batch_tokens=300)
    want = np.concatenate(late_chunk_reference(default_model_dir, documents, prompt="query: ",
                                               window=minilm.max_seq_length, overlap=64))
    assert cos_dist(got["EMBEDDINGS"], want).max() < 1e-5
    # a chunk's vector is not the vector of the chunk embedded alone (the context counts)
    alone = engine.embed([minilm.encode([body[1]])[0].tolist()])
    assert cos_dist(got["EMBEDDINGS"][1:2], alone)[0] > 1e-3


def test_hidden_states_have_graphs_of_their_own(folders):
    """The static-buffer path (a stand-in graph on the CPU): a batch asking for hidden states is
    captured under its own key and replayed with the right rows; dense-only batches keep theirs."""
    from rose_backend.engine.batch import PackedBatch
    from rose_testing.folders import random_ids
    from rose_testing.reference import Reference
    folder = folders["tiny-bert (mean)"]
    engine = Engine(ModelConfig.from_folder(folder), options=EngineOptions(graphs=True))
    ref = Reference(folder)
    rng = np.random.default_rng(1)
    for step in range(3):                                   # eager, capture, replay
        lens = np.array([5, 9], np.int32)
        ids = random_ids(rng, 1000, int(lens.sum()))
        handle = engine.step(PackedBatch(ids, lens, frozenset({"hidden"})))
        dense = handle.synchronize()
        hidden = handle.extras["hidden"]
        assert engine.last_key[-1] == "hidden" and hidden.shape == (14, 64)
        want = np.concatenate([ref.hidden(ids[:5]).numpy(), ref.hidden(ids[5:]).numpy()])
        np.testing.assert_allclose(hidden, want, atol=1e-4)
        np.testing.assert_allclose(dense, ref.embed([ids[:5], ids[5:]]), atol=1e-4)
    assert engine.stats.graph_captures == 1 and engine.stats.graph_replays == 1
    engine.step(PackedBatch(ids, lens)).synchronize()
    assert "hidden" not in engine.last_key and engine.stats.eager_runs == 2      # its own first sight


def test_one_batch_of_plain_and_late_jobs_answers_each_its_own(minilm):
    """tokenize_batched encodes waiting requests together: a refused late-chunking job gets its own
    error, the others their outputs, as if encoded alone."""
    from rose_ensemble.text_requests import TextJob, encode_jobs
    chunker = LateChunker(minilm)
    plain = TextJob(["hello world", "a second text"], np.zeros(2, bool), counted=True)
    good = TextJob(documents=[["Paris is ", "big."]])
    bad = TextJob(documents=[["Paris", ""]])
    results = encode_jobs(minilm, chunker, [plain, bad, good, TextJob(["alone"], np.zeros(1, bool))])
    assert isinstance(results[1], InputError) and "TEXT[1] (document 0, chunk 1)" in str(results[1])
    alone = [encode_jobs(minilm, chunker, [j])[0] for j in (plain, good)]
    for got, want in zip((results[0], results[2]), alone):
        assert [n for n, _ in got] == [n for n, _ in want]
        for (_, a), (_, b) in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert [n for n, _ in results[2]] == ["INPUT_IDS", "SEQ_LENS", "TOKEN_CHUNKS"]
    assert [n for n, _ in results[3]] == ["INPUT_IDS", "SEQ_LENS"]
