"""Text -> ragged ids, compared with sentence-transformers' own tokenization."""
import numpy as np
import pytest

from rose_ensemble.tokenize_settings import parse_prompts
from rose_ensemble.tokenization import InputError, TextTokenizer

TEXTS = ["hello", "The quick brown fox " * 100, "naïve café 日本語", "🙂🙃 emoji only", "  spaced   out  "]


@pytest.fixture(scope="module")
def tok(default_model_dir):
    return TextTokenizer.from_folder(default_model_dir, prompts={"query": "query: ", "passage": "passage: "})


def st_ids(sentence_model, texts):
    feats = sentence_model.tokenize(texts)
    return [row[mask.bool()].tolist() for row, mask in zip(feats["input_ids"], feats["attention_mask"])]


def test_ragged_ids_equal_sentence_transformers(tok, sentence_model):
    ids, lens = tok.encode(TEXTS)
    assert ids.dtype == np.int32 and lens.dtype == np.int32 and int(lens.sum()) == len(ids)
    ours = np.split(ids, np.cumsum(lens)[:-1])
    for got, want in zip(ours, st_ids(sentence_model, TEXTS)):
        assert got.tolist() == want
    assert lens.max() == sentence_model.max_seq_length == 256      # truncated like sentence-transformers


def test_prompt_is_prepended_before_truncation(tok, sentence_model):
    ids, lens = tok.encode(TEXTS, prompt_name="query")
    want = st_ids(sentence_model, ["query: " + t for t in TEXTS])
    assert [a.tolist() for a in np.split(ids, np.cumsum(lens)[:-1])] == want


def test_unknown_prompt_name_is_an_input_error(tok):
    with pytest.raises(InputError, match="unknown task / prompt name 'nope'.*'passage', 'query'"):
        tok.encode(["x"], prompt_name="nope")


def test_decode_texts_names_the_bad_element(tok):
    assert tok.decode_texts([b"ok", "also ok"]) == ["ok", "also ok"]
    with pytest.raises(InputError, match=r"TEXT\[1\] is not valid UTF-8"):
        tok.decode_texts([b"ok", b"\xff\xfe bad"])
    with pytest.raises(InputError, match=r"TEXT\[0\] is an empty string"):
        tok.decode_texts([b""])
    with pytest.raises(InputError, match="TEXT is empty"):
        tok.decode_texts([])


def test_huge_text_is_cut_before_tokenizing(default_model_dir):
    tok = TextTokenizer.from_folder(default_model_dir, max_text_bytes=1000)
    texts = tok.decode_texts([("mot é " * 2_000_000).encode()])     # 14 MB
    assert len(texts[0].encode()) <= 1000
    ids, lens = tok.encode(texts)
    assert lens[0] == 256


def test_parse_prompts():
    assert parse_prompts('{"q": "query: "}') == {"q": "query: "}
    assert parse_prompts("  ") == {}
    with pytest.raises(ValueError, match="JSON object"):
        parse_prompts('["q"]')


def test_fallback_prompts_fill_in_only_the_names_a_model_lacks(default_model_dir, tmp_path):
    """The shipped deployment's fallback_prompts: "query" / "passage" exist on every model; the
    symmetric default model embeds the text as it is, a model with its own prompts keeps them."""
    from rose_ensemble.tokenize_settings import TokenizeSettings
    from rose_testing.qwen3 import QUERY_PROMPT, write_qwen3_folder
    fallback = TokenizeSettings().fallback_prompt_map
    assert fallback == {"query": "", "passage": ""}
    tok = TextTokenizer.from_folder(default_model_dir, fallback_prompts=fallback)
    for task in ("query", "passage"):
        np.testing.assert_array_equal(tok.encode(TEXTS, task)[0], tok.encode(TEXTS)[0])
    qwen = TextTokenizer.from_folder(write_qwen3_folder(tmp_path / "q"), fallback_prompts=fallback)
    assert qwen.prompts == {"query": QUERY_PROMPT, "document": "", "passage": ""}
    over = TextTokenizer.from_folder(default_model_dir, prompts={"query": "q: "}, fallback_prompts=fallback)
    assert over.prompts["query"] == "q: "                # the deployment's `prompts` still override
