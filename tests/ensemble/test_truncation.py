"""Honest truncation without a server: each text's tokens before truncation (prompt and special
tokens included) against transformers' own count of the untruncated text, the cut marks (at
max_seq_length tokens, or at max_text_bytes bytes before tokenizing, when the count is a lower
bound), and rose's TOKEN_COUNTS / TRUNCATED (the tokenizer's when given, else SEQ_LENS)."""
import numpy as np
import pytest

from rose_backend.serving.outputs import OutputOptions, build_outputs, choose_outputs, with_token_inputs
from rose_backend.serving.scheduler import Request
from rose_backend.serving.validation import RequestLimits
from rose_ensemble.text_requests import TextJob, encode_jobs, wants_counts
from rose_ensemble.tokenization import TextTokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory, default_model_dir):
    from rose_testing.m3_folders import make_m3_folder
    from rose_testing.qwen3 import write_qwen3_folder
    root = tmp_path_factory.mktemp("truncation-folders")
    return {"minilm (wordpiece)": default_model_dir,
            "xlm-r (unigram)": make_m3_folder(root / "m3", max_seq_length=32, max_positions=64),
            "qwen3-embedding (eos appended)": write_qwen3_folder(root / "qwen3", style="qwen3-embedding")}


def transformers_count(folder, text: str) -> int:
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    return len(tok(text, add_special_tokens=True, truncation=False)["input_ids"])


@pytest.mark.parametrize("family", ["minilm (wordpiece)", "xlm-r (unigram)", "qwen3-embedding (eos appended)"])
def test_counts_before_truncation_match_transformers(folders, family):
    from rose_testing.qwen3 import WORDS
    folder = folders[family]
    tok = TextTokenizer.from_folder(folder, prompts={"query": "the query : "})
    m = tok.max_seq_length
    rng = np.random.default_rng(3)
    texts = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=n)) for n in (1, 5, m // 2, m, 3 * m, 20 * m)]
    ids, lens, counts = tok.encode_counted(texts, "query")
    want = [transformers_count(folder, "the query : " + t) for t in texts]
    assert counts.tolist() == want
    assert lens.tolist() == [min(n, m) for n in want]
    assert ids.size == lens.sum() and counts.dtype == np.int32
    assert (counts > lens).tolist() == [n > m for n in want] and (counts > lens).sum() >= 2


def test_the_job_marks_token_and_byte_cuts(default_model_dir):
    tok = TextTokenizer.from_folder(default_model_dir, max_text_bytes=200)
    words = "Paris is the capital of France and Berlin is the capital of Germany "
    raw = [b"short text", (words * 2).encode(), (words * 3).encode(), ("\u00e9" * 150).encode()]
    texts, cut = tok.decode_texts_marked(raw)
    assert cut.tolist() == [False, False, True, True]
    assert texts[2].endswith("capital of") and len(texts[2].encode()) <= 200    # cut at its last space
    assert texts[3] == "\u00e9" * 100                                            # none: at the limit
    (outputs,) = encode_jobs(tok, None, [TextJob(texts, cut, counted=True)])
    out = dict(outputs)
    full = [transformers_count(default_model_dir, t.decode()) for t in raw]
    assert out["TOKEN_COUNTS"][:2].tolist() == full[:2]
    # a text cut at max_text_bytes is counted over what was kept: a lower bound, marked cut
    assert out["TOKEN_COUNTS"][2] == transformers_count(default_model_dir, texts[2]) < full[2]
    # without a whitespace near the limit the count is that of the bytes kept, no bound: a 150-letter
    # word is one [UNK] for WordPiece, its first 100 letters are many tokens
    assert out["TOKEN_COUNTS"][3] == transformers_count(default_model_dir, texts[3]) > full[3]
    assert out["TRUNCATED"].tolist() == [False, False, True, True]
    assert out["SEQ_LENS"].tolist() == [min(n, 256) for n in out["TOKEN_COUNTS"].tolist()]
    (plain,) = encode_jobs(tok, None, [TextJob(texts, cut)])
    assert [n for n, _ in plain] == ["INPUT_IDS", "SEQ_LENS"]             # not asked: not sent


def test_which_requests_ask_for_counts():
    assert wants_counts("token_counts") and wants_counts(" sparse , Truncated") and wants_counts(None, ["TRUNCATED"])
    assert not wants_counts("sparse,colbert") and not wants_counts("") and not wants_counts(None, ["EMBEDDINGS"])
    every = frozenset({"INPUT_IDS", "SEQ_LENS", "TOKEN_COUNTS", "TRUNCATED"})
    assert not wants_counts(None, every, every) and wants_counts(None, every - {"SEQ_LENS"}, every)   # none named
    names, engine = choose_outputs({"EMBEDDINGS", "TOKEN_COUNTS"}, None)
    assert names == {"EMBEDDINGS", "TOKEN_COUNTS"} and engine == frozenset()
    names, _ = choose_outputs({"EMBEDDINGS", "TRUNCATED"}, "truncated")
    assert names == {"EMBEDDINGS", "TRUNCATED"}
    with pytest.raises(ValueError, match="names SPARSE_IDS, TOKEN_COUNTS as outputs but its parameter"):
        choose_outputs({"EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED", "SPARSE_IDS"}, "truncated")     # never left out
    with pytest.raises(ValueError, match="takes sparse, colbert, token_counts, truncated"):
        choose_outputs({"EMBEDDINGS"}, "counts")


LIMITS = RequestLimits(max_seq_len=512, vocab_size=1000)
ASK = OutputOptions(frozenset({"EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"}), frozenset())


def _answer(lens, inputs):
    lens = np.asarray(lens, np.int32)
    r = Request(np.ones(int(lens.sum()), np.int32), lens)
    r.output = np.ones((lens.size, 4), np.float32)
    opts = with_token_inputs(ASK, inputs, lens, LIMITS)
    return dict(build_outputs(r, opts, True, None))


def test_rose_counts_what_it_was_given():
    out = _answer([3, 7], {})
    assert out["TOKEN_COUNTS"].tolist() == [3, 7] and out["TRUNCATED"].tolist() == [False, False]
    assert out["TOKEN_COUNTS"].dtype == np.int32 and out["TRUNCATED"].dtype == np.bool_
    out = _answer([3, 7], {"TOKEN_COUNTS": np.array([3, 900], np.int32)})
    assert out["TOKEN_COUNTS"].tolist() == [3, 900] and out["TRUNCATED"].tolist() == [False, True]
    out = _answer([3, 7], {"TOKEN_COUNTS": np.array([3, 7], np.int32), "TRUNCATED": np.array([True, False])})
    assert out["TRUNCATED"].tolist() == [True, False]                     # cut in bytes: as the tokenizer says


@pytest.mark.parametrize("inputs, message", [
    ({"TOKEN_COUNTS": np.array([3], np.int32)}, "TOKEN_COUNTS holds 1 counts for 2 sequences"),
    ({"TOKEN_COUNTS": np.array([3, 6], np.int32)}, r"TOKEN_COUNTS\[1\] = 6 is below the 7 tokens in sequence 1"),
    ({"TOKEN_COUNTS": np.array([3, 7], np.int64)}, "TOKEN_COUNTS must be INT32"),
    ({"TRUNCATED": np.array([1, 0], np.int32)}, "TRUNCATED must be BOOL"),
    ({"TRUNCATED": np.array([True])}, "TRUNCATED holds 1 flags for 2 sequences")])
def test_bad_counts_are_named(inputs, message):
    with pytest.raises(ValueError, match=message):
        _answer([3, 7], inputs)
