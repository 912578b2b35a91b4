"""Should rose swap Hugging Face `tokenizers` for a faster tokenizer.json reader? Parity and speed.

    python -m rose_bench tokenizers                       # full study, writes results/tokenizers/cpu.json
    python -m rose_bench tokenizers --quick               # small corpus, few rounds (a smoke run)

Three tokenizers: (1) WordPiece, the default model's own tokenizer.json (all-MiniLM-L6-v2:
BertNormalizer, BertPreTokenizer, [CLS] $A [SEP]); (2) byte-level BPE shaped like Qwen3's (NFC,
Qwen's split regex then ByteLevel, `$A <|endoftext|>`), and (3) Unigram shaped like XLM-R / BGE-M3's
(NFKC and runs of spaces folded, Metaspace, `<s> $A </s>`), both trained here with `tokenizers`' own
trainers on a seeded generated corpus; and (4, where sentencepiece and transformers are installed)
`unigram-spm`: a SentencePiece Unigram model converted by transformers' XLMRobertaConverter, the way
XLM-R's and BGE-M3's tokenizer.json were made (Precompiled charsmap normalizer). Every tokenizer.json is loaded without padding or truncation
(rose calls no_padding() and sets its own truncation).

The corpus (seeded): texts of 9, 128, 512 and 4,096 words drawn from text Python ships
(pydoc_data's topic help, the `this` module) and generated words: accented and decomposed Latin,
CJK, kana, Hangul, other scripts, emoji (ZWJ sequences, skin tones, flags), control and format
characters, special-token look-alikes, numbers; words joined by mixed whitespace; plus empty and
whitespace-only texts.

Parity: every candidate's ids against `tokenizers`' encode_batch(add_special_tokens=True), on every
text, untruncated and truncated at 512 tokens (where the candidate can truncate), batch and one text
at a time; mismatch counts and the first mismatch.
Speed (each in a child process, candidates interleaved in a shuffled order per round, each round's
time divided by the reference's in the same round; median and min-max over the rounds):
batch throughput per text length, single-threaded (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
and with the library's own parallelism (all cores); and one-text latency (a 9-word and a 128-word
text, microseconds per call). A candidate that is not installed, or cannot load a tokenizer, is
skipped with the reason in the table.
"""
from __future__ import annotations

import argparse
import codecs
import copy
import hashlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from importlib import metadata
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
if str(BENCH_DIR) not in sys.path:        # the speed worker runs this file as a script
    sys.path.insert(0, str(BENCH_DIR))

from rose_bench.record import log, run_record, save_json  # noqa: E402

LENGTHS = (9, 128, 512, 4096)
TRUNCATE = 512
# texts per length (full study; --quick divides); plus EMPTY_TEXTS empty / whitespace-only texts
CORPUS_COUNTS = {9: 1500, 128: 1000, 512: 400, 4096: 100}
# texts per length in one timed batch call
BATCH_SIZES = {9: 1000, 128: 200, 512: 50, 4096: 12}

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


# ----------------------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------------------

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
    texts: Unigram's vocabulary must hold every character it was trained on), so the corpus also
    has characters the trained vocabularies never saw."""
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
        import sentencepiece as spm
        import transformers.convert_slow_tokenizer as convert
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


# ----------------------------------------------------------------------------------------------
# adapters: one interface over every library
# ----------------------------------------------------------------------------------------------

class Unsupported(Exception):
    """The library is missing, or cannot load this tokenizer.json (or truncate)."""


def template_ids(path: Path) -> tuple[list[int], list[int]]:
    """The ids a TemplateProcessing post-processor puts before and after a single sequence."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    pp = cfg.get("post_processor") or {}
    if pp.get("type") != "TemplateProcessing":
        raise Unsupported(f"post-processor {pp.get('type')} not reproduced")
    before, after, seen = [], [], False
    for piece in pp["single"]:
        if "Sequence" in piece:
            seen = True
        else:
            ids = pp["special_tokens"][piece["SpecialToken"]["id"]]["ids"]
            (after if seen else before).extend(ids)
    return before, after


class Adapter:
    """batch(texts) -> list of id lists, one(text) -> id list; add_special_tokens=True always."""
    name = ""
    module = ""
    parallel_batch = True     # does its batch call use several threads (its own claim)

    def __init__(self, path: Path, truncate: int | None):
        try:
            self.lib = __import__(self.module)
        except ImportError as e:
            raise Unsupported(f"not installed ({e})") from None
        try:
            self.load(path, truncate)
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"cannot load: {type(e).__name__}: {str(e)[:160]}") from None

    @classmethod
    def version(cls) -> str | None:
        try:
            return metadata.version(cls.module)
        except metadata.PackageNotFoundError:
            return None

    def load(self, path: Path, truncate: int | None) -> None:
        raise NotImplementedError


class HFTokenizers(Adapter):
    """The reference: `tokenizers` encode_batch / encode (with offsets, what encode_batch returns)."""
    name, module = "tokenizers", "tokenizers"

    def load(self, path, truncate):
        self.tok = self.lib.Tokenizer.from_file(str(path))
        self.tok.no_padding()
        if truncate:
            self.tok.enable_truncation(truncate)
        else:
            self.tok.no_truncation()

    def batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=True)]

    def one(self, text):
        return self.tok.encode(text, add_special_tokens=True).ids


class HFTokenizersFast(HFTokenizers):
    """What rose runs today: encode_batch_fast (no offsets), a one-text list on the query path."""
    name = "tokenizers-fast"

    def batch(self, texts):
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=True)]

    def one(self, text):
        return self.tok.encode_batch_fast([text], add_special_tokens=True)[0].ids


class Tokie(Adapter):
    name, module = "tokie", "tokie"

    def load(self, path, truncate):
        self.tok = self.lib.Tokenizer.from_json(str(path))
        self.tok.no_padding()
        if truncate:
            self.tok.enable_truncation(truncate)
        else:
            self.tok.no_truncation()

    def batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=True)]

    def one(self, text):
        return self.tok.encode(text, add_special_tokens=True).ids


class Fastokens(Adapter):
    name, module = "fastokens", "fastokens"

    def load(self, path, truncate):
        self.tok = self.lib.Tokenizer.from_file(str(path))
        self.tok.no_padding()
        if truncate:
            self.tok.enable_truncation(truncate)
        else:
            self.tok.no_truncation()

    def batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=True)]

    def one(self, text):
        return self.tok.encode(text, add_special_tokens=True).ids


class FastokensFlat(Fastokens):
    """fastokens' encode_batch_flat: every text's ids in one uint32 buffer plus offsets, the shape
    rose sends on (flat ids, lengths) without a Python list per text."""
    name = "fastokens-flat"

    def batch(self, texts):
        import numpy as np
        ids, offsets = self.tok.encode_batch_flat(texts, add_special_tokens=True)
        offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return np.split(np.frombuffer(ids, dtype=np.uint32), offsets[1:-1])


class Snaptokens(Fastokens):
    name, module = "snaptokens", "snaptokens"


class Kitoken(Adapter):
    """kitoken applies no post-processor and no truncation of its own here: the template's ids are
    added, and the text's ids cut, in Python (inside the timed call)."""
    name, module = "kitoken", "kitoken"

    def load(self, path, truncate):
        self.before, self.after = template_ids(path)
        self.tok = self.lib.Kitoken.from_tokenizers_file(str(path))
        cfg = self.tok.config()
        if cfg.get("processing"):
            cfg["processing"] = []
            self.tok.set_config(cfg)
        self.keep = truncate - len(self.before) - len(self.after) if truncate else None

    def _wrap(self, ids):
        return self.before + (ids[:self.keep] if self.keep is not None else ids) + self.after

    def batch(self, texts):
        return [self._wrap(ids) for ids in self.tok.encode_all(texts, True)]

    def one(self, text):
        return self._wrap(self.tok.encode(text, True))


class Budtiktok(Adapter):
    """Truncates only through its HF-style __call__ (which pads to the longest text)."""
    name, module = "budtiktok", "budtiktok"

    def load(self, path, truncate):
        self.tok = self.lib.Tokenizer.from_file(str(path))
        self.truncate = truncate

    def batch(self, texts):
        if self.truncate:       # its only truncating call pads to the longest: the padding is cut off
            out = self.tok(texts, max_length=self.truncate, truncation=True)
            return [ids[:sum(mask)] for ids, mask in zip(out["input_ids"], out["attention_mask"])]
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=True)]

    def one(self, text):
        if self.truncate:
            return self.batch([text])[0]
        return self.tok.encode(text, add_special_tokens=True).ids


REFERENCE = HFTokenizers
ADAPTERS = [HFTokenizers, HFTokenizersFast, Tokie, Fastokens, FastokensFlat, Kitoken, Budtiktok, Snaptokens]
CANDIDATES = [a for a in ADAPTERS if a.module != "tokenizers"]


def as_list(ids) -> list[int]:
    return [int(i) for i in ids]


# ----------------------------------------------------------------------------------------------
# parity
# ----------------------------------------------------------------------------------------------

def first_mismatch(i: int, text: str, want: list[int], got) -> dict:
    got = as_list(got) if not isinstance(got, str) else got
    if isinstance(got, str):
        return {"text_index": i, "text": repr(text[:200]), "error": got}
    pos = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return {"text_index": i, "text_chars": len(text), "text": repr(text[:200]), "want_len": len(want), "got_len": len(got),
            "first_diff": pos, "want": want[max(0, pos - 3):pos + 5], "got": got[max(0, pos - 3):pos + 5]}


def compare(texts: list[str], want: list[list[int]], got_fn, per_text: bool) -> dict:
    """Mismatches of got_fn's ids against want. per_text: got_fn(text) per text; else one batch
    call (if it raises, each text alone, so one bad text is counted as one)."""
    if per_text:
        got = []
        for t in texts:
            try:
                got.append(got_fn(t))
            except Exception as e:
                got.append(f"{type(e).__name__}: {str(e)[:160]}")
    else:
        try:
            got = got_fn(texts)
        except Exception:
            return compare(texts, want, lambda t: got_fn([t])[0], per_text=True)
    bad = [i for i, (w, g) in enumerate(zip(want, got)) if isinstance(g, str) or as_list(g) != w]
    out = {"texts": len(texts), "mismatches": len(bad), "errors": sum(isinstance(got[i], str) for i in bad),
           "mismatches_with_words": sum(bool(texts[i].strip()) for i in bad)}
    if bad:     # the shortest mismatching text with words in it (an empty one only if none)
        shortest = min(bad, key=lambda i: (not texts[i].strip(), len(texts[i])))
        out["example"] = first_mismatch(shortest, texts[shortest], want[shortest], got[shortest])
        out["mismatch_indices"] = bad[:50]
    return out


MINIMIZE_CALLS = 4000


def minimize(text: str, differs, budget: int | None = None) -> str:
    """A shortest-found piece of `text` on which differs() still holds (chunks of characters
    removed while it does, halving the chunk size), within `budget` calls."""
    calls, parts, budget = 0, 2, budget or MINIMIZE_CALLS
    while len(text) > 1 and calls < budget:
        chunk = max(1, len(text) // parts)
        for start in range(0, len(text), chunk):
            calls += 1
            shorter = text[:start] + text[start + chunk:]
            if differs(shorter):
                text, parts = shorter, max(parts - 1, 2)
                break
        else:
            if chunk == 1:
                break
            parts = min(len(text), parts * 2)
    return text


def minimal_example(ref, cand, text: str) -> dict:
    """The smallest piece of a mismatching text found that still mismatches, one text at a time."""
    def encode(t):
        try:
            return as_list(cand.one(t))
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:160]}"

    def differs(t):
        return bool(t.strip()) == bool(text.strip()) and encode(t) != ref.one(t)
    if not differs(text):          # mismatches in the batch call only
        return {"batch_only": True}
    small = minimize(text, differs)
    return {"text": small, "text_repr": ascii(small), "want": ref.one(small), "got": encode(small)}


def parity(paths: dict[str, Path], corpus: list[dict], adapters=ADAPTERS) -> dict:
    """{tokenizer: {candidate: {"plain": {"batch", "one"}, "truncated": ...} or {"skipped": why}}}."""
    texts = [c["text"] for c in corpus]
    out = {}
    for tname, path in paths.items():
        out[tname] = {}
        for mode, truncate in (("plain", None), ("truncated", TRUNCATE)):
            ref = REFERENCE(path, truncate)
            want = ref.batch(texts)
            assert [ref.one(t) for t in texts[:50]] == want[:50], "tokenizers encode != encode_batch"
            for a in adapters:
                if a is REFERENCE:
                    continue
                entry = out[tname].setdefault(a.name, {})
                if "skipped" in entry:
                    continue
                try:
                    cand = a(path, truncate)
                except Unsupported as e:
                    entry.clear()
                    entry["skipped"] = str(e)
                    continue
                t0 = time.monotonic()
                entry[mode] = {"batch": compare(texts, want, cand.batch, per_text=False),
                               "one": compare(texts, want, cand.one, per_text=True)}
                minimal = {}
                for kind in ("batch", "one"):
                    if entry[mode][kind]["mismatches"] and mode == "plain":
                        i = entry[mode][kind]["example"]["text_index"]
                        if i not in minimal:
                            minimal[i] = minimal_example(ref, cand, texts[i])
                        entry[mode][kind]["minimal"] = minimal[i]
                    elif entry[mode][kind]["mismatches"]:
                        i = entry[mode][kind]["example"]["text_index"]
                        entry[mode][kind]["example"]["want_tail"] = want[i][-4:]
                log(f"parity {tname:9s} {mode:9s} {a.name:15s} batch {entry[mode]['batch']['mismatches']:5d} "
                    f"one {entry[mode]['one']['mismatches']:5d} / {len(texts)} ({time.monotonic() - t0:.1f}s)")
            out[tname]["_tokens"] = {mode: sum(map(len, want))} | out[tname].get("_tokens", {})
    return out


def identical(entry: dict) -> bool | None:
    """True: identical ids on every text, batch and one at a time, plain and truncated."""
    if "skipped" in entry:
        return None
    return all(entry[m][k]["mismatches"] == 0 for m in ("plain", "truncated") if m in entry for k in ("batch", "one"))


# ----------------------------------------------------------------------------------------------
# speed (a child process per thread setting)
# ----------------------------------------------------------------------------------------------

def _timed(fn, arg, inner: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(inner):
        fn(arg)
    wall = time.perf_counter() - t0
    return wall, (time.process_time() - c0) / wall if wall else 0.0


def interleaved(cands: dict, arg, inner: int, rounds: int, rng: random.Random) -> dict:
    """{name: {"s": [seconds per round], "cpu_per_wall": [...]}}: every round times each candidate
    `inner` times over `arg`, in a shuffled order."""
    times = {n: {"s": [], "cpu_per_wall": []} for n in cands}
    names = list(cands)
    for _ in range(rounds):
        rng.shuffle(names)
        for n in names:
            wall, cpu = _timed(cands[n], arg, inner)
            times[n]["s"].append(wall)
            times[n]["cpu_per_wall"].append(round(cpu, 2))
    return times


def ratio_stats(mine: list[float], ref: list[float]) -> dict:
    """Speed-up against the reference, per round (reference time / candidate time)."""
    r = sorted(b / a for a, b in zip(mine, ref))
    return {"median": round(statistics.median(r), 3), "min": round(r[0], 3), "max": round(r[-1], 3)}


def speed_worker(spec: dict) -> dict:
    """Runs in a child process under the thread setting chosen by its environment."""
    if spec.get("cpus"):            # before any library starts its threads: they see these cores only
        os.sched_setaffinity(0, spec["cpus"])
    corpus = json.loads(Path(spec["corpus"]).read_text(encoding="utf-8"))
    rng = random.Random(spec["seed"])
    target_s, rounds = spec["target_s"], spec["rounds"]
    out = {"env": {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")},
           "cpus": sorted(os.sched_getaffinity(0)), "loadavg_before": os.getloadavg(), "tokenizers": {}}
    for tname, path in spec["paths"].items():
        adapters = {}
        for a in ADAPTERS:
            try:
                adapters[a.name] = a(Path(path), None)
            except Unsupported:
                pass
        res = out["tokenizers"][tname] = {"batch": {}, "one": {}}
        for words in LENGTHS:
            texts = [c["text"] for c in corpus if c["words"] == words][:spec["batch_sizes"][str(words)]]
            if not texts:
                continue
            tokens = {n: sum(map(len, a.batch(texts))) for n, a in adapters.items()}     # also the warm-up
            wall, _ = _timed(adapters["tokenizers"].batch, texts, 1)
            inner = max(1, round(target_s / max(wall, 1e-6)))
            times = interleaved({n: a.batch for n, a in adapters.items()}, texts, inner, rounds, rng)
            cell = res["batch"][str(words)] = {"texts": len(texts), "inner": inner}
            for n, t in times.items():
                med = statistics.median(t["s"]) / inner
                cell[n] = {"texts_per_s": round(len(texts) / med, 1), "tokens_per_s": round(tokens[n] / med),
                           "vs_tokenizers": ratio_stats(t["s"], times["tokenizers"]["s"]),
                           "vs_tokenizers_fast": ratio_stats(t["s"], times["tokenizers-fast"]["s"]),
                           "cpu_per_wall": statistics.median(t["cpu_per_wall"]), "round_s": [round(x, 4) for x in t["s"]]}
            log(f"[{out['env']['RAYON_NUM_THREADS'] or 'all'} threads] {tname} {words} words: " + ", ".join(
                f"{n} x{c['vs_tokenizers']['median']}" for n, c in cell.items() if isinstance(c, dict)))
        for words in (9, 128):
            text = next(c["text"] for c in corpus if c["words"] == words)
            for a in adapters.values():
                a.one(text)
            wall, _ = _timed(adapters["tokenizers"].one, text, 20)
            inner = max(20, round(target_s / 2 / max(wall / 20, 1e-7)))
            times = interleaved({n: a.one for n, a in adapters.items()}, text, inner, rounds, rng)
            cell = res["one"][str(words)] = {"inner": inner}
            for n, t in times.items():
                cell[n] = {"us_per_call": round(statistics.median(t["s"]) / inner * 1e6, 2),
                           "vs_tokenizers": ratio_stats(t["s"], times["tokenizers"]["s"]),
                           "vs_tokenizers_fast": ratio_stats(t["s"], times["tokenizers-fast"]["s"])}
    out["loadavg_after"] = os.getloadavg()
    return out


def run_speed(work: Path, paths: dict[str, Path], corpus: list[dict], threads: int | None, args) -> dict:
    """speed_worker in a child process: threads=1 pins the process to one core (CPU affinity: some
    libraries start threads of their own whatever RAYON_NUM_THREADS says) and sets rayon's and
    tokenizers' switches; None leaves each library its own parallelism on all cores."""
    corpus_path = work / "corpus.json"
    if not corpus_path.exists():
        corpus_path.write_text(json.dumps(corpus, ensure_ascii=False), encoding="utf-8")
    spec = {"corpus": str(corpus_path), "paths": {k: str(v) for k, v in paths.items()}, "seed": args.seed,
            "rounds": args.rounds, "target_s": args.target_ms / 1e3,
            "batch_sizes": {str(k): max(1, v // (4 if args.quick else 1)) for k, v in BATCH_SIZES.items()},
            "cpus": sorted(os.sched_getaffinity(0))[:threads] if threads else None}
    spec_path = work / f"speed_{threads or 'all'}.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    if threads:
        env.update(RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    else:
        env["TOKENIZERS_PARALLELISM"] = "true"
    result_path = work / f"speed_{threads or 'all'}_result.json"
    subprocess.run([sys.executable, __file__, "--speed-worker", str(spec_path), str(result_path)], env=env, check=True)
    return json.loads(result_path.read_text())


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

def decide(result: dict) -> dict:
    """Per tokenizer, the candidates that pass the rule: identical ids on every text (batch and one
    at a time, untruncated and truncated) AND at least 2x tokenizers' encode_batch (the median of
    every text length's cell, single-threaded and parallel)."""
    verdict = {}
    for tname, cands in result["parity"].items():
        verdict[tname] = {}
        for cname, entry in cands.items():
            if cname.startswith("_") or cname.startswith("tokenizers"):
                continue
            same = identical(entry)
            if same is None:
                verdict[tname][cname] = {"passes_rule": False, "why": "skipped: " + entry["skipped"]}
                continue
            speeds = [run["tokenizers"][tname]["batch"][w][cname]["vs_tokenizers"]["median"]
                      for run in result["speed"].values() for w in run["tokenizers"][tname]["batch"]
                      if cname in run["tokenizers"][tname]["batch"][w]]
            lowest = min(speeds) if speeds else None
            why = []
            if not same:
                worst = max((entry[m][k]["mismatches"], m, k) for m in ("plain", "truncated") if m in entry
                            for k in ("batch", "one"))
                why.append(f"ids differ on {worst[0]} of {entry['plain']['batch']['texts']} texts "
                           f"({'untruncated' if worst[1] == 'plain' else 'truncated'}, {worst[2]})")
            if lowest is None or lowest < 2:
                why.append(f"slowest batch cell {lowest}x tokenizers (< 2x)")
            verdict[tname][cname] = {"passes_rule": not why, "min_batch_speedup": lowest,
                                     "why": "; ".join(why) or f"identical ids; slowest batch cell {lowest}x"}
    return verdict


def fmt_parity(entry: dict) -> str:
    if "skipped" in entry:
        return "skip"
    cells = []
    for m in ("plain", "truncated"):
        if m in entry:
            cells.append(f"{entry[m]['batch']['mismatches']}/{entry[m]['one']['mismatches']}")
    return " ".join(cells)


def table(result: dict) -> str:
    lines = []
    names = [a.name for a in ADAPTERS if a is not REFERENCE]
    n_texts = result["corpus"]["texts"]
    lines.append(f"Parity: mismatching texts of {n_texts}, 'batch/one' untruncated then truncated at {TRUNCATE}")
    lines.append("")
    lines.append("| tokenizer | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for tname, cands in result["parity"].items():
        lines.append(f"| {tname} | " + " | ".join(fmt_parity(cands.get(n, {"skipped": "-"})) for n in names) + " |")
    lines.append("")
    skipped = {}
    for tname, c in result["parity"].items():
        for n, e in c.items():
            if not n.startswith("_") and "skipped" in e:
                skipped.setdefault((n, e["skipped"]), []).append(tname)
    for (n, why), tnames in sorted(skipped.items()):
        lines.append(f"  skip {n} ({', '.join(tnames)}): {why}")
    for label, run in result.get("speed", {}).items():
        lines.append("")
        load = [f"{x[0]:.1f}" if x else "?" for x in (run.get("loadavg_before"), run.get("loadavg_after"))]
        lines.append(f"Batch speed-up vs tokenizers encode_batch ({label}; cores {run.get('cpus')}, load average "
                     f"{load[0]} -> {load[1]}): median [min-max] over rounds; last column: tokenizers' tokens/s")
        lines.append("")
        lines.append("| tokenizer | words | " + " | ".join(names) + " | tokenizers tok/s |")
        lines.append("|---|---|" + "---|" * (len(names) + 1))
        for tname, res in run["tokenizers"].items():
            for w, cell in res["batch"].items():
                row = []
                for n in names:
                    c = cell.get(n)
                    row.append(f"{c['vs_tokenizers']['median']:.2f} [{c['vs_tokenizers']['min']:.2f}-"
                               f"{c['vs_tokenizers']['max']:.2f}]" if c else "skip")
                lines.append(f"| {tname} | {w} | " + " | ".join(row) + f" | {cell['tokenizers']['tokens_per_s']:,} |")
        lines.append("")
        lines.append(f"One text ({label}): us per call (speed-up vs tokenizers encode)")
        lines.append("")
        lines.append("| tokenizer | words | tokenizers | " + " | ".join(names) + " |")
        lines.append("|---|---|---|" + "---|" * len(names))
        for tname, res in run["tokenizers"].items():
            for w, cell in res["one"].items():
                row = [f"{cell[n]['us_per_call']:.1f} (x{cell[n]['vs_tokenizers']['median']:.2f})" if n in cell else "skip"
                       for n in names]
                lines.append(f"| {tname} | {w} | {cell['tokenizers']['us_per_call']:.1f} | " + " | ".join(row) + " |")
    if "decision" in result:
        lines.append("")
        lines.append("The rule (identical ids on every text, batch and one at a time, untruncated and truncated, AND "
                     ">= 2x tokenizers encode_batch, median, in every batch cell of both thread settings):")
        for tname, v in result["decision"].items():
            for cname, d in v.items():
                lines.append(f"  {tname:11s} {cname:14s} {'PASSES' if d['passes_rule'] else 'fails'}: {d['why']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench tokenizers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "tokenizers" / "cpu.json")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--quick", action="store_true", help="a tenth of the corpus, 3 rounds, smaller tokenizers")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per cell (default 9; 3 with --quick)")
    p.add_argument("--target-ms", type=float, default=None, help="time per candidate per round (default 60)")
    p.add_argument("--no-speed", action="store_true", help="parity only")
    p.add_argument("--tokenizer", action="append", default=[], metavar="NAME=PATH",
                   help="also test this tokenizer.json (e.g. a real model's), under NAME; repeatable")
    p.add_argument("--git-commit", default=None)
    p.add_argument("--speed-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.speed_worker:
        spec, out = args.speed_worker
        Path(out).write_text(json.dumps(speed_worker(json.loads(Path(spec).read_text()))))
        return 0
    args.rounds = args.rounds or (3 if args.quick else 9)
    args.target_ms = args.target_ms or (20 if args.quick else 60)
    t_start = time.monotonic()
    counts = {w: max(2, n // 10) if args.quick else n for w, n in CORPUS_COUNTS.items()}
    result = run_record(args.git_commit, "cpu")
    result["versions"] = {a.module: a.version() for a in ADAPTERS}
    with tempfile.TemporaryDirectory(prefix="rose_tokenizers_bench_") as tmp:
        work = Path(tmp)
        corpus = make_corpus(args.seed, counts)
        result["corpus"] = {"seed": args.seed, "texts": len(corpus), "per_length": {str(k): v for k, v in counts.items()},
                            "empty_or_whitespace": sum(c["words"] == 0 for c in corpus),
                            "chars": sum(len(c["text"]) for c in corpus),
                            "sha256": hashlib.sha256(json.dumps(corpus, ensure_ascii=False).encode()).hexdigest()}
        log(f"corpus: {len(corpus)} texts, {result['corpus']['chars']:,} characters")
        paths = build_tokenizers(work, args.seed, 300 if args.quick else 3000,
                                 4000 if args.quick else 16000, 2000 if args.quick else 8000)
        for spec in args.tokenizer:
            name, _, path = spec.partition("=")
            paths[name] = without_padding_or_truncation(Path(path), work / f"{name}.json")
        result["tokenizer_files"] = {k: {"sha256": hashlib.sha256(v.read_bytes()).hexdigest(),
                                         "model": json.loads(v.read_text())["model"]["type"]} for k, v in paths.items()}
        result["parity"] = parity(paths, corpus)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        save_json(args.out, result, t_start)
        if not args.no_speed:
            result["speed"] = {}
            for label, threads in (("single-threaded", 1), ("library's own parallelism", None)):
                result["speed"][label] = run_speed(work, paths, corpus, threads, args)
                save_json(args.out, result, t_start)
            result["decision"] = decide(result)
    save_json(args.out, result, t_start)
    print(table(result))
    log(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
