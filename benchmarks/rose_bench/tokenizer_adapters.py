"""One interface over every tokenizer library in the tokenizers study: batch(texts) and one(text)
give id lists with the special tokens added; a library that is missing or cannot load a
tokenizer.json raises Unsupported."""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from importlib import metadata
from pathlib import Path


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


class Adapter(ABC):
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

    @abstractmethod
    def load(self, path: Path, truncate: int | None) -> None:
        """Read the tokenizer.json at `path` (truncating at `truncate` tokens when given)."""


class HFTokenizers(Adapter):
    """The reference: `tokenizers` encode_batch / encode (with offsets, what encode_batch returns)."""
    name, module = "tokenizers", "tokenizers"

    def load(self, path, truncate):
        self.configure(self.lib.Tokenizer.from_file(str(path)), truncate)

    def configure(self, tok, truncate):
        self.tok = tok
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


class Tokie(HFTokenizers):
    """tokie mirrors the `tokenizers` API; only the loader is named differently."""
    name, module = "tokie", "tokie"

    def load(self, path, truncate):
        self.configure(self.lib.Tokenizer.from_json(str(path)), truncate)


class Fastokens(HFTokenizers):
    """fastokens mirrors the `tokenizers` API too (from_file, encode, encode_batch)."""
    name, module = "fastokens", "fastokens"


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
