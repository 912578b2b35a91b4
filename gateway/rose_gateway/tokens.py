"""What the gateway knows of the served model, from its Hugging Face folder and the deployment's
`tokenize` settings: the tokenizer itself (rose_ensemble's TextTokenizer and LateChunker, the code
the server's `tokenize` model runs, so the ids are exactly the ones `embed` would compute), the
truncation length, whether it normalises, its embeddings' width (the sentence-transformers chain's
output, after any Dense module) and its name.

    model = ModelInfo(folder)
    model.use_server_settings(config)        # Triton's `tokenize` model config: prompts, limits
    toks = model.tokenize(["what is rose?"], task="query", truncate=True)
    toks.ids, toks.lens, toks.truncated      # int32 [T], int32 [n], bool [n]

Settings: the folder's prompts under the deployment's (`prompts`, `fallback_prompts`,
`default_prompt_name`), `max_seq_length`, `max_text_bytes` (a longer text is cut to it first, at a
whitespace near the limit) and `late_chunk_overlap`, merged as the `tokenize` model merges them.
Until Triton has reported them (server_settings_known), texts go to `embed` and the folder's
tokenizer only counts their tokens.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rose_ensemble.late_chunks import ChunkPlan, LateChunker
from rose_ensemble.tokenization import InputError, TextTokenizer
from rose_gateway.errors import bad_request

log = logging.getLogger("rose_gateway")
_TEXT_INDEX = re.compile(r"TEXT\[(\d+)\]")


@dataclass(slots=True)
class Tokens:
    ids: np.ndarray             # int32 [sum(lens)]: every text's ids end to end
    lens: np.ndarray            # int32 [n]: tokens embedded per text
    truncated: np.ndarray       # bool [n]: cut at max_seq_length tokens or at max_text_bytes bytes

    @property
    def total(self) -> int:
        return int(self.lens.sum(dtype=np.int64))


class ModelInfo:
    def __init__(self, model_dir: str | Path | None):
        from rose_backend.config import ModelConfig     # stdlib only: no torch
        from rose_ensemble.tokenize_settings import TokenizeSettings    # json and dataclasses only
        cfg = ModelConfig.from_folder(model_dir)
        self.config = cfg                   # pooling, kind, config.json (TEI's GET /info)
        self.folder = cfg.model_dir
        self.name = model_name(cfg.model_dir)
        self.normalizes = cfg.normalize
        self.dimensions = cfg.embedding_dim  # the width of one embedding: the folder's chain's output (1: a reranker)
        self.is_embedding = cfg.kind == "embedding"
        self.folder_prompts = dict(cfg.prompts)
        self._use(TokenizeSettings(), None)
        self.server_answered = False        # Triton told us the tokenize settings (understood or not)
        self.server_settings_known = False  # ... and they are in force here

    def _use(self, s, overlap: int | None) -> None:
        self.tokenizer = TextTokenizer.from_folder(
            self.folder, max_seq_length=s.max_seq_length or None, prompts=s.prompt_map,
            fallback_prompts=s.fallback_prompt_map, default_prompt_name=s.default_prompt_name or None,
            max_text_bytes=s.max_text_bytes)
        self.chunker = LateChunker(self.tokenizer, overlap) if self.is_embedding else None
        self.prompts = self.tokenizer.prompts
        self._variants: dict[str, TextTokenizer | Tokenizer] = {}

    def left_tokenizer(self) -> TextTokenizer:
        """The tokenizer under the same settings, truncating on the left (TEI's truncation_direction)."""
        tok = self._variants.get("left")
        if tok is None:
            tok = dataclasses.replace(self.tokenizer, tokenizer=Tokenizer.from_str(self.tokenizer.tokenizer.to_str()))
            tok.tokenizer.enable_truncation(tok.max_seq_length, direction="left")
            self._variants["left"] = tok
        return tok

    def untruncated(self) -> Tokenizer:
        """The folder's Hugging Face tokenizer without truncation (TEI's /tokenize and /decode)."""
        tok = self._variants.get("full")
        if tok is None:
            tok = self._variants["full"] = Tokenizer.from_str(self.tokenizer.tokenizer.to_str())
            tok.no_truncation()
        return tok

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.max_seq_length

    def use_server_settings(self, model_config: dict) -> None:
        """The deployment's own `tokenize` settings (its config.pbtxt parameters, as Triton reports
        them), merged as the tokenize model merges them."""
        from rose_ensemble.tokenize_settings import TokenizeSettings
        self.server_answered = True
        params = dict(model_config.get("parameters") or {})
        try:
            settings = TokenizeSettings.from_model_config({"parameters": params})
            self._use(settings, settings.overlap)
        except ValueError as e:                      # a server newer than this gateway: texts go to `embed`
            log.warning("the server's tokenize settings are not understood here (%s); texts go through "
                        "`embed` and their token counts use the model folder's settings", e)
            return
        self.server_settings_known = True

    def check_task(self, task: str | None) -> None:
        """400 naming 'task' for a prompt name the deployment does not know (once its settings are known;
        before that the server's own refusal answers)."""
        if task and self.server_settings_known and task not in self.prompts:
            known = ", ".join(repr(k) for k in sorted(self.prompts)) or "none"
            raise bad_request("task", f"unknown task / prompt name {task!r}; this model knows: {known}")

    def _prompt(self, task: str | None) -> str:
        try:
            return self.tokenizer.prompt_for(task)
        except InputError as e:
            if self.server_settings_known:
                raise bad_request("task", str(e)) from None
            return ""                                # counts only: the server refuses the task itself

    def tokenize(self, texts: list[str], task: str | None, truncate: bool, left: bool = False) -> Tokens:
        """Each text once, as `tokenize` does it: cut to max_text_bytes, the task's prompt in front,
        truncated at max_seq_length (left=True: its first tokens are cut, the special tokens kept).
        truncate=False: 400 naming the first text that would be cut."""
        tok = self.left_tokenizer() if left else self.tokenizer
        self.check_task(task)
        prompt = self._prompt(task)
        if tok.max_text_bytes and any(len(t) * 4 > tok.max_text_bytes for t in texts):
            texts, cut = tok.decode_texts_marked(texts, "input")
        else:                                        # no text can be over the byte limit
            cut = np.zeros(len(texts), dtype=bool)
        ids, lens, counts = tok.encode_requests([[prompt + t for t in texts] if prompt else texts], [True])[0]
        truncated = (counts > lens) | cut
        if not truncate and truncated.any():
            i = int(np.flatnonzero(truncated)[0])
            why = (f"is over max_text_bytes={tok.max_text_bytes} bytes" if cut[i] else
                   f"has {int(counts[i])} tokens; this model embeds at most {tok.max_seq_length}")
            raise bad_request(f"input[{i}]", f"input[{i}] {why} (send \"truncate\": true to cut it there)")
        return Tokens(ids, lens, truncated)

    def plan_late_chunks(self, chunks: list[str], task: str | None) -> ChunkPlan:
        """One document given as its chunks -> rose's INPUT_IDS, SEQ_LENS (windows of a long one) and
        TOKEN_CHUNKS; 400 naming the chunk that has no token of its own, or the input over max_text_bytes."""
        if self.chunker is None:
            raise bad_request("late_chunking", "late chunking is not available for this model (a reranker)")
        self.check_task(task)
        prompt = self._prompt(task)
        try:
            self.chunker.check_sizes([c.encode("utf-8") for c in chunks], np.array([len(chunks)], np.int32))
            return self.chunker.plan([chunks], prompt)
        except InputError as e:
            m = _TEXT_INDEX.search(str(e))
            raise bad_request(f"input[{m.group(1)}]" if m else "input", str(e).replace("TEXT[", "input[")) from None

    def cut_token_lists(self, token_lists: list[list[int]], truncate: bool, left: bool = False) -> list[list[int]]:
        if not truncate:
            self.check_lengths([len(t) for t in token_lists])
            return token_lists
        m = self.max_seq_length
        if left:
            return [t[len(t) - m:] if len(t) > m else t for t in token_lists]
        return [t[:m] if len(t) > m else t for t in token_lists]

    def check_lengths(self, counts: list[int]) -> None:
        for i, n in enumerate(counts):
            if n > self.max_seq_length:
                raise bad_request(f"input[{i}]", f"input[{i}] has {n} tokens; this model embeds at most "
                                                 f"{self.max_seq_length} (send \"truncate\": true to cut it there)")


def model_name(folder: Path) -> str:
    """The id /v1/models shows: "all-MiniLM-L6-v2" for the default model, "org/name" for a Hugging Face
    cache snapshot (models--org--name/snapshots/<hash>), else the folder's name."""
    from rose_backend.config import default_model_dir
    try:
        if folder.resolve() == default_model_dir().resolve():
            return "all-MiniLM-L6-v2"
    except Exception:                                   # the default model package is not installed
        pass
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name[len("models--"):].replace("--", "/")
    return folder.name
