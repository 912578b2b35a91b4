"""The tokenizers study's inputs: the seeded corpus (text Python ships plus generated words that are
not plain English: accents, scripts, emoji, controls, special-token look-alikes, numbers, mixed
whitespace) and the tokenizer.json files under test (the default model's WordPiece, and byte-level
BPE and Unigram trained here on a seeded generated corpus)."""
from __future__ import annotations

import codecs
import io
import json
import random
import sys
import time
import unicodedata
from pathlib import Path

from rose_bench.record import log

LENGTHS = (9, 128, 512, 4096)
# texts per length (full study; --quick divides); plus EMPTY_TEXTS empty / whitespace-only texts
CORPUS_COUNTS = {9: 1500, 128: 1000, 512: 400, 4096: 100}

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def source_words() -> list[str]:
    """Words of text that Python ships: the interactive help's topics and the Zen of Python."""
    import contextlib
    import io
    import pydoc_data.topics
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the Zen on first import; its text is this.s, in rot13)
    text = " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    text += " " + codecs.decode(sys.modules["this"].s, "rot13")
    return text.split()


ACCENTS = {"a": "àáâäåã", "e": "èéêë", "i": "ìíîï", "o": "òóôöøõ", "u": "ùúûü", "c": "ç", "n": "ñ", "s": "ßš", "y": "ýÿ"}
SPECIAL_LOOKALIKES = ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "<s>", "</s>", "<unk>", "<pad>", "<mask>",
                      "<|endoftext|>", "<|im_start|>", "<|im_end|>", "##ing", "▁", "Ġ", "[cls]", "<S>"]
CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x1b[0m", "\x7f", "\x85", "\u200b", "\u200c", "\u200d", "\u200e",
            "\ufeff", "\u00ad", "\ufffd", "\u2028", "\u2029", "\u2060", "\ue000", "\U000e0041"]
SEPARATORS = [" "] * 30 + ["  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2003", " \t ", "   \n",
                           "\x0b", "\x0c", "\u202f", "\r", ""]
EMOJI_SEQUENCES = ["👨‍👩‍👧‍👦", "👍🏽", "🏳️‍🌈", "❤️", "🇫🇷", "🇯🇵", "👩🏿‍💻", "1️⃣", "🤷‍♀️", "🧑‍🤝‍🧑"]
SCRIPTS = [(0x0400, 0x044F), (0x0391, 0x03C9), (0x05D0, 0x05EA), (0x0627, 0x064A), (0x0905, 0x0939),
           (0x0E01, 0x0E30), (0x10D0, 0x10F0), (0x0531, 0x0556)]
CJK = [(0x4E00, 0x9FFF), (0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0x3400, 0x4DBF), (0x20000, 0x2A6DF)]
EMOJI = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x2600, 0x26FF)]
FULLWIDTH_AND_COMPAT = ["ｆｕｌｌｗｉｄｔｈ", "ﬁ", "ﬂ", "Ⅻ", "①", "㎞", "ｶﾀｶﾅ", "²", "½", "™", "ℌ", "Å", "ǅ"]


def _from_ranges(rng: random.Random, ranges, n: int, narrow: bool = False) -> str:
    if narrow:
        ranges = [(lo, min(hi, lo + 150)) for lo, hi in ranges]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


def generated_word(rng: random.Random, pool: list[str], narrow: bool = False) -> str:
    """One word that is not plain English: accents, scripts, emoji, controls, look-alikes, numbers.
    narrow: CJK, scripts and emoji from the first 151 code points of each range only (the training
    texts, whose every character Unigram's vocabulary must hold), so the corpus also has characters
    the trained vocabularies never saw."""
    kind = rng.randrange(12)
    base = rng.choice(pool)
    if kind == 0:       # accented, composed
        return "".join(rng.choice(ACCENTS[c]) if c in ACCENTS and rng.random() < 0.4 else c for c in base)
    if kind == 1:       # accented, decomposed (combining marks), or upper case accents
        word = "".join(rng.choice(ACCENTS[c]) if c in ACCENTS and rng.random() < 0.5 else c for c in base)
        return unicodedata.normalize("NFD", word if rng.random() < 0.5 else word.upper())
    if kind in (2, 3):  # CJK / kana / Hangul runs
        return _from_ranges(rng, CJK, rng.randint(1, 6), narrow)
    if kind == 4:       # other scripts, sometimes with a Devanagari / Hebrew combining mark
        word = _from_ranges(rng, [rng.choice(SCRIPTS)], rng.randint(2, 9), narrow)
        return word + ("\u093e" if rng.random() < 0.3 else "")
    if kind == 5:       # emoji, single or sequences, glued to a word sometimes
        e = rng.choice(EMOJI_SEQUENCES) if rng.random() < 0.4 else _from_ranges(rng, EMOJI, rng.randint(1, 3), narrow)
        return e if rng.random() < 0.6 else base + e
    if kind == 6:       # a control or format character inside or around a word
        c, i = rng.choice(CONTROLS), rng.randint(0, len(base))
        return base[:i] + c + base[i:]
    if kind == 7:
        return rng.choice(SPECIAL_LOOKALIKES) + (base if rng.random() < 0.3 else "")
    if kind == 8:       # numbers
        return rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))), f"{rng.random() * 1000:.3f}",
                           f"{rng.randint(1, 9)},{rng.randint(100, 999)},{rng.randint(100, 999)}",
                           f"20{rng.randint(10, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                           hex(rng.randint(0, 1 << 32))])
    if kind == 9:       # full-width, ligatures, compatibility forms (NFKC changes them)
        return rng.choice(FULLWIDTH_AND_COMPAT) + (base if rng.random() < 0.3 else "")
    if kind == 10:      # case, apostrophes and punctuation runs
        return rng.choice([base.upper(), base.title(), base + "'s", base + "'LL", "don't", base + "...",
                           "--" + base, base + "?!", "(" + base + ")", "\"" + base + "\"", base + "’s"])
    return base * rng.randint(2, 4)     # long repeated word


def make_text(rng: random.Random, pool: list[str], words: int, narrow: bool = False) -> str:
    parts = []
    for _ in range(words):
        parts.append(generated_word(rng, pool, narrow) if rng.random() < 0.3 else rng.choice(pool))
        parts.append(rng.choice(SEPARATORS))
    text = "".join(parts[:-1])
    if rng.random() < 0.1:
        text = rng.choice(SEPARATORS[30:]) + text + rng.choice(SEPARATORS[30:])
    return text


EMPTY_TEXTS = ["", " ", "  ", "\n", "\t", "\r\n", "\u3000", "\u200b", "\x00", " \n\t ", "\ufeff", "\u00a0"]


def make_corpus(seed: int, counts: dict[int, int]) -> list[dict]:
    """[{"words": n (0 for the empty ones), "text": ...}], seeded; shuffled so a batch mixes lengths."""
    rng = random.Random(seed)
    pool = source_words()
    corpus = [{"words": 0, "text": t} for t in EMPTY_TEXTS for _ in range(3)]
    for words, n in counts.items():
        corpus += [{"words": words, "text": make_text(rng, pool, words)} for _ in range(n)]
    rng.shuffle(corpus)
    return corpus


# ----------------------------------------------------------------------------------------------
# the tokenizers under test
# ----------------------------------------------------------------------------------------------

def without_padding_or_truncation(path: Path, out: Path) -> Path:
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["padding"] = None
    cfg["truncation"] = None
    out.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    return out


def build_bpe(train_texts: list[str], vocab_size: int, out: Path) -> Path:
    """Byte-level BPE shaped like Qwen3's tokenizer.json (NFC, Qwen's split regex, ByteLevel,
    `$A <|endoftext|>`), trained on train_texts."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_texts, trainer=trainer)
    tok.add_special_tokens(specials)
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A <|endoftext|> $B <|endoftext|>",
                                                       special_tokens=[("<|endoftext|>", eot)])
    tok.save(str(out))
    return out


def build_unigram(train_texts: list[str], vocab_size: int, out: Path) -> Path:
    """Unigram shaped like XLM-R / BGE-M3's tokenizer.json (NFKC, runs of spaces folded, Metaspace,
    `<s> $A </s>`; <s> <pad> </s> <unk> first, <mask> last), trained on train_texts."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", max_piece_length=16, show_progress=False)
    tok.train_from_iterator(train_texts, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(out))
    return out


def build_unigram_spm(train_texts: list[str], vocab_size: int, out: Path) -> Path | None:
    """Unigram the way XLM-R's and BGE-M3's tokenizer.json came about: a SentencePiece model
    (nmt_nfkc normalization; <unk> <s> </s> first) converted by transformers' XLMRobertaConverter
    (Precompiled charsmap normalizer, Metaspace, fairseq ids: <s> <pad> </s> <unk> first, <mask>
    last, `<s> $A </s>`). None where sentencepiece or transformers is not installed."""
    try:
        import importlib

        import sentencepiece as spm
        # the module itself: `import transformers.convert_slow_tokenizer as convert` can bind the
        # function of that name that transformers exports, once its lazy namespace has loaded it
        convert = importlib.import_module("transformers.convert_slow_tokenizer")
    except ImportError as e:
        log(f"no SentencePiece Unigram tokenizer: {e}")
        return None
    try:
        from sentencepiece import sentencepiece_model_pb2 as model_pb2
    except ImportError:     # generated for a newer protobuf than the one installed: transformers' copy
        from transformers.utils import sentencepiece_model_pb2_new as model_pb2
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(train_texts), model_writer=model, model_type="unigram",
                                   vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=0.9995,
                                   normalization_rule_name="nmt_nfkc", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   num_threads=1, minloglevel=2)
    model_file = out.with_suffix(".model")
    model_file.write_bytes(model.getvalue())

    class SlowTokenizer:         # what the converter reads of a slow XLMRobertaTokenizer
        vocab_file, legacy, add_prefix_space = str(model_file), True, True

        @staticmethod
        def convert_tokens_to_ids(token):
            return {"<s>": 0, "</s>": 2}[token]

    saved = convert.import_protobuf
    convert.import_protobuf = lambda *args, **kwargs: model_pb2
    try:
        tok = convert.XLMRobertaConverter(SlowTokenizer()).converted()
    finally:
        convert.import_protobuf = saved
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    cfg = json.loads(tok.to_str())
    # XLM-R's and BGE-M3's files have the older converter's normalizer: the charsmap, then runs of
    # spaces to one (newer converters add a right Strip and fold the runs to "▁")
    precompiled = [n for n in cfg["normalizer"]["normalizers"] if n["type"] == "Precompiled"]
    cfg["normalizer"]["normalizers"] = precompiled + [{"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]
    out.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    return out


def build_tokenizers(work: Path, seed: int, train_texts: int, bpe_vocab: int, unigram_vocab: int) -> dict[str, Path]:
    """{"wordpiece": the default model's, "bpe": ..., "unigram": ..., "unigram-spm": ... (where
    sentencepiece and transformers are installed)} tokenizer.json paths under work."""
    from rose_backend.config import default_model_dir
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    pool = source_words()
    train = [make_text(rng, pool, 128, narrow=True) for _ in range(train_texts)]
    paths = {"wordpiece": without_padding_or_truncation(Path(default_model_dir()) / "tokenizer.json",
                                                        work / "wordpiece.json")}
    t0 = time.monotonic()
    paths["bpe"] = build_bpe(train, bpe_vocab, work / "bpe.json")
    log(f"trained byte-level BPE ({bpe_vocab}) in {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    paths["unigram"] = build_unigram(train, unigram_vocab, work / "unigram.json")
    log(f"trained Unigram ({unigram_vocab}) in {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    spm_path = build_unigram_spm(train, unigram_vocab, work / "unigram-spm.json")
    if spm_path:
        paths["unigram-spm"] = spm_path
        log(f"trained SentencePiece Unigram ({unigram_vocab}) and converted it in {time.monotonic() - t0:.1f}s")
    return paths
