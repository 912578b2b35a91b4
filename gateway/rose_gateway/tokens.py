"""What the gateway knows of the served model, from its Hugging Face folder: token counts for
`usage`, the truncation length, whether it normalises, and its name.

Counts come from rose_client's TextTokenCounter (the model's own tokenizer.json, Rust `tokenizers`)
on the text as the server's `tokenize` model tokenizes it: the task's prompt prepended, texts cut to
max_text_bytes first, the count capped at max_seq_length, where the server truncates. Prompts and
limits come from the model folder, overridden by the deployment's `tokenize` parameters as Triton
reports them (fetched on the first request that finds a replica up). Token-id inputs are counted exactly (their length).
"""
from __future__ import annotations

import logging
from pathlib import Path

from rose_client.chunking import TextTokenCounter

from rose_gateway.errors import bad_request

log = logging.getLogger("rose_gateway")


class ModelInfo:
    def __init__(self, model_dir: str | Path | None, max_text_bytes: int = 65536):
        from rose_backend.config import ModelConfig     # stdlib only: no torch
        cfg = ModelConfig.from_folder(model_dir)
        self.name = model_name(cfg.model_dir)
        self.max_seq_length = cfg.max_seq_length
        self.normalizes = cfg.normalize
        self.folder_prompts, self.folder_default_prompt_name = dict(cfg.prompts), cfg.default_prompt_name
        self.prompts, self.default_prompt_name = dict(cfg.prompts), cfg.default_prompt_name
        self.max_text_bytes = max_text_bytes
        self.counter = TextTokenCounter(cfg.model_dir, max_text_tokens=1 << 30)   # uncapped: see count_texts
        self.server_answered = False        # Triton told us the tokenize settings (understood or not)
        self.server_settings_known = False  # ... and they are in force here

    def use_server_settings(self, model_config: dict) -> None:
        """The deployment's own `tokenize` settings (its config.pbtxt parameters, as Triton reports
        them), merged as the tokenize model merges them: fallback prompts, then the folder's, then
        the deployment's; its default prompt, max_seq_length and max_text_bytes when set."""
        from rose_backend.serving.settings import TokenizeSettings    # json and dataclasses only
        self.server_answered = True
        try:
            s = TokenizeSettings.from_model_config(model_config)
        except ValueError as e:                      # a server newer than this gateway: keep the folder's
            log.warning("the server's tokenize settings are not understood here (%s); token counts use "
                        "the model folder's prompts and limits", e)
            return
        self.prompts = {**s.fallback_prompt_map, **self.folder_prompts, **s.prompt_map}
        self.default_prompt_name = s.default_prompt_name or self.folder_default_prompt_name
        if s.max_seq_length:
            self.max_seq_length = s.max_seq_length
        self.max_text_bytes = s.max_text_bytes or 1 << 62
        self.server_settings_known = True

    def check_task(self, task: str | None) -> None:
        """400 naming 'task' for a prompt name the deployment does not know (once its settings are known;
        before that the server's own refusal answers)."""
        if task and self.server_settings_known and task not in self.prompts:
            known = ", ".join(repr(k) for k in sorted(self.prompts)) or "none"
            raise bad_request("task", f"unknown task / prompt name {task!r}; this model knows: {known}")

    def count_texts(self, texts: list[str], task: str | None, truncate: bool) -> list[int]:
        """Tokens each text is embedded with. truncate=False: 400 for a text over max_seq_length."""
        prompt = self.prompts.get(task or self.default_prompt_name or "", "")
        cut = [t if len(t) * 4 <= self.max_text_bytes else
               t.encode("utf-8")[: self.max_text_bytes].decode("utf-8", errors="ignore") for t in texts]
        counts = self.counter([prompt + t for t in cut] if prompt else cut)
        if not truncate:
            self.check_lengths(counts)
        return [min(n, self.max_seq_length) for n in counts]

    def most_tokens(self, texts: list[str], task: str | None) -> int:
        """At least the tokens `texts` are embedded with (truncated), without tokenizing them: a token
        covers one byte of UTF-8 or more, a character is at most 4 bytes, and a few special tokens."""
        prompt = self.prompts.get(task or self.default_prompt_name or "", "")
        extra, m = 4 * len(prompt) + 8, self.max_seq_length
        return sum(min(m, 4 * len(t) + extra) for t in texts)

    def cut_token_lists(self, token_lists: list[list[int]], truncate: bool) -> list[list[int]]:
        if not truncate:
            self.check_lengths([len(t) for t in token_lists])
            return token_lists
        m = self.max_seq_length
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
