"""`python -m rose_bench tokenizers` on a small corpus: the parity check against `tokenizers` (and
every candidate installed here), a missing candidate skipped with its reason, one speed round in
a child process, the decision and the table. The numbers mean nothing here."""
import argparse

import pytest

from rose_bench import tokenizer_adapters as ta
from rose_bench import tokenizer_corpus as tc
from rose_bench import tokenizer_parity as tp
from rose_bench import tokenizers_bench as tb

COUNTS = {9: 24, 128: 8, 512: 2, 4096: 1}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    work = tmp_path_factory.mktemp("tokenizers_bench")
    corpus = tc.make_corpus(7, COUNTS)
    paths = tc.build_tokenizers(work, 7, train_texts=80, bpe_vocab=1000, unigram_vocab=2500)
    return work, corpus, paths


class NotInstalled(ta.Fastokens):
    name, module = "not-installed", "rose_no_such_tokenizer_module"


def test_corpus_is_seeded_and_covers_the_hard_cases():
    a, b = tc.make_corpus(3, COUNTS), tc.make_corpus(3, COUNTS)
    assert a == b and a != tc.make_corpus(4, COUNTS)
    texts = "".join(c["text"] for c in a)
    assert {c["words"] for c in a} == {0, 9, 128, 512, 4096}
    assert "" in [c["text"] for c in a]
    assert any(0x4E00 <= ord(ch) <= 0x9FFF for ch in texts)          # CJK
    assert any(0x1F300 <= ord(ch) <= 0x1F9FF for ch in texts)        # emoji
    assert any(ord(ch) < 0x20 and ch not in "\t\n\r" for ch in texts)  # control characters
    assert "\u3000" in texts and "\u00a0" in texts and "\t" in texts  # mixed whitespace


def test_parity_against_tokenizers(study, monkeypatch):
    _, corpus, paths = study
    monkeypatch.setattr(tp, "MINIMIZE_CALLS", 300)
    result = tp.parity(paths, corpus, adapters=ta.ADAPTERS + [NotInstalled])
    assert {"wordpiece", "bpe", "unigram"} <= set(result) <= {"wordpiece", "bpe", "unigram", "unigram-spm"}
    for tname, cands in result.items():
        # rose's own path (encode_batch_fast) gives encode_batch's ids, untruncated and truncated
        assert tp.identical(cands["tokenizers-fast"]) is True, tname
        assert "not installed" in cands["not-installed"]["skipped"]
        for cname, entry in cands.items():
            if cname.startswith("_") or "skipped" in entry:
                continue
            for mode in ("plain", "truncated"):
                for kind in ("batch", "one"):
                    cell = entry[mode][kind]
                    assert cell["texts"] == len(corpus) and 0 <= cell["mismatches"] <= len(corpus)
                    if cell["mismatches"]:
                        assert "example" in cell
    assert "not-installed" in tb.table({"corpus": {"texts": len(corpus)}, "parity": result})


def test_truncation_keeps_the_template_tokens(study):
    _, corpus, paths = study
    long_text = next(c["text"] for c in corpus if c["words"] == 4096)
    for tname, path in paths.items():
        ids = ta.HFTokenizers(path, tp.TRUNCATE).one(long_text)
        before, after = ta.template_ids(path)
        assert len(ids) == tp.TRUNCATE, tname
        assert ids[:len(before)] == before and ids[len(ids) - len(after):] == after, tname


def test_minimize_finds_a_small_mismatch():
    assert tp.minimize("abcdefXghijk" * 3, lambda t: "X" in t) == "X"


def test_one_speed_round_decision_and_table(study):
    work, corpus, paths = study
    args = argparse.Namespace(seed=7, rounds=1, target_ms=1.0, quick=True)
    speed = tb.run_speed(work, {"bpe": paths["bpe"]}, corpus, 1, args)
    cell = speed["tokenizers"]["bpe"]["batch"]["128"]
    assert cell["tokenizers"]["texts_per_s"] > 0 and cell["tokenizers"]["vs_tokenizers"]["median"] == 1
    assert speed["tokenizers"]["bpe"]["one"]["9"]["tokenizers"]["us_per_call"] > 0
    assert speed["env"]["RAYON_NUM_THREADS"] == "1"
    result = {"corpus": {"texts": len(corpus)}, "parity": {"bpe": tp.parity({"bpe": paths["bpe"]}, corpus)["bpe"]},
              "speed": {"single-threaded": speed}}
    result["decision"] = tb.decide(result)
    assert result["decision"]["bpe"]["tokie"]["passes_rule"] in (True, False)
    assert "The rule" in tb.table(result)
