"""(query, documents) -> ragged token ids of the pairs a reranker scores, the way its peer library does.

    tok = PairTokenizer.from_folder(model_dir)
    ids, lens, types = tok.encode("what is rose?", ["a flower", "a server"], instruction=None)
    # ids, types: int32 [sum(lens)] (segment ids: 0 query, 1 document for BERT; all 0 otherwise);
    # lens: int32 [n documents]. No padding anywhere.

Cross-encoders (model_kind.py): the pair as sentence-transformers' CrossEncoder.predict tokenizes it,
tokenizer(query, document, truncation="longest_first", max_length=max_seq_length), i.e. the fast
tokenizer's pair template (`[CLS] q [SEP] d [SEP]`, `<s> q </s></s> d </s>`) and longest-first
truncation: tokens come off the longer of the two until the pair fits. A long document is cut and
a short query kept whole; a query longer than its document can be cut too, exactly as
sentence-transformers does. A query that alone fills max_seq_length (no room for any document
token) is refused with an error.

Qwen3-Reranker: the model card's recipe: prefix + tokenizer(format_instruction(instruction, query,
document), truncation to max_length - len(prefix) - len(suffix)) + suffix. The formatted text ends
with the document, so the document's tail is cut; a query (with its instruction) that alone
exceeds that budget is refused with an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rose_backend.model_kind import (QWEN3_RERANKER_PREFIX, QWEN3_RERANKER_SUFFIX, qwen3_reranker_text)
from rose_ensemble.tokenization import InputError, TextTokenizer


@dataclass
class PairTokenizer:
    texts: TextTokenizer                 # the folder's tokenizer (longest-first at max_seq_length) and limits
    kind: str                            # cross-encoder | qwen3-reranker
    prefix_ids: list[int] | None = None  # Qwen3-Reranker: the card's prefix / suffix token ids
    suffix_ids: list[int] | None = None

    def __post_init__(self):
        if self.kind == "qwen3-reranker":
            self._plain = plain = Tokenizer.from_str(self.texts.tokenizer.to_str())
            plain.no_truncation()
            plain.no_padding()
            self.prefix_ids = plain.encode(QWEN3_RERANKER_PREFIX, add_special_tokens=False).ids
            self.suffix_ids = plain.encode(QWEN3_RERANKER_SUFFIX, add_special_tokens=False).ids
            if self.body_budget <= 0:
                raise ValueError(f"max_seq_length {self.texts.max_seq_length} leaves no room between the "
                                 f"Qwen3-Reranker prefix and suffix ({len(self.prefix_ids) + len(self.suffix_ids)} tokens)")
            self.texts.tokenizer.enable_truncation(self.body_budget)     # the formatted pair only
        elif self.kind != "cross-encoder":
            raise ValueError(f"this model is an {self.kind} model, not a reranker: it cannot score pairs")

    @classmethod
    def from_folder(cls, model_dir: str | Path, kind: str | None = None, max_seq_length: int | None = None,
                    max_text_bytes: int = 0, max_texts: int = 0) -> "PairTokenizer":
        from rose_backend.config import ModelConfig
        cfg = ModelConfig.from_folder(model_dir, kind)
        tok = Tokenizer.from_file(str(Path(cfg.model_dir) / "tokenizer.json"))
        return cls(TextTokenizer(tok, max_seq_length or cfg.max_seq_length, max_text_bytes=max_text_bytes,
                                 max_texts=max_texts), cfg.kind)

    @property
    def body_budget(self) -> int:
        """Qwen3-Reranker: tokens left for the formatted (instruction, query, document) text."""
        return self.texts.max_seq_length - len(self.prefix_ids) - len(self.suffix_ids)

    def decode(self, query: bytes | str, documents, instruction: bytes | str | None = None) -> tuple[str, list[str], str | None]:
        """Triton BYTES inputs -> (query, documents, instruction) strings; empty documents are fine."""
        q = self.texts.decode_texts([query], name="QUERY")[0]
        docs = self.texts.decode_texts(documents, name="DOCUMENTS", allow_empty=True)
        instr = None
        if instruction is not None:
            instr = self.texts.decode_texts([instruction], name="INSTRUCTION", allow_empty=True)[0] or None
        return q, docs, instr

    def encode(self, query: str, documents: list[str], instruction: str | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids int32 [T], lens int32 [n], token type ids int32 [T]) of the n pairs, in order."""
        if self.kind == "qwen3-reranker":
            encodings = self._encode_qwen3(query, documents, instruction)
        else:
            if instruction:
                raise InputError("this cross-encoder takes no INSTRUCTION (only Qwen3-Reranker models do)")
            self._check_query(len(self.texts.tokenizer.encode(query, add_special_tokens=False).ids)
                              + self.texts.tokenizer.num_special_tokens_to_add(True))
            encodings = [(e.ids, e.type_ids) for e in
                         self.texts.encode_batch([(query, d) for d in documents], add_special_tokens=True)]
        lens = np.fromiter((len(i) for i, _ in encodings), dtype=np.int32, count=len(encodings))
        total = int(lens.sum())
        ids = np.fromiter(chain.from_iterable(i for i, _ in encodings), dtype=np.int32, count=total)
        types = np.fromiter(chain.from_iterable(ty for _, ty in encodings), dtype=np.int32, count=total)
        return ids, lens, types

    def _encode_qwen3(self, query: str, documents: list[str], instruction: str | None):
        alone = len(self._plain.encode(qwen3_reranker_text(query, "", instruction), add_special_tokens=True).ids)
        if alone > self.body_budget:            # the instruction + query would be cut: no room for a document
            self._check_query(alone + len(self.prefix_ids) + len(self.suffix_ids))
        bodies = self.texts.encode_batch([qwen3_reranker_text(query, d, instruction) for d in documents],
                                         add_special_tokens=True)
        pre, suf = self.prefix_ids, self.suffix_ids
        return [(pre + e.ids + suf, [0] * (len(pre) + len(e.ids) + len(suf))) for e in bodies]

    def _check_query(self, query_tokens: int) -> None:
        if query_tokens >= self.texts.max_seq_length:
            raise InputError(f"the query is too long: with the template it takes {query_tokens} tokens, and this "
                             f"model scores at most {self.texts.max_seq_length} tokens per query-document pair "
                             "(max_seq_length); shorten the query")
