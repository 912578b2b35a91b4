"""A TEXT request of `tokenize` / `tokenize_batched`, read and encoded (no Triton types here).

    job = read_text_job(inputs, tokenizer, chunker, counted=wants_counts(parameter))
    [outputs] = encode_jobs(tokenizer, chunker, [job])    # [(name, array)], or an InputError

Outputs, by name: INPUT_IDS, SEQ_LENS always; TOKEN_COUNTS INT32 [n] and TRUNCATED BOOL [n] when
`counted` (each text's tokens before truncation, prompt and special tokens included, and whether
it was cut: at max_seq_length tokens, or at max_text_bytes bytes before tokenizing, when the count
is that of the bytes kept: a lower bound when the cut fell on a whitespace, as it does when there
is one in the last 256 bytes before the limit: tokenization.py); TOKEN_CHUNKS INT32 [T] for late
chunking (DOC_CHUNKS given: late_chunks.py), where TOKEN_COUNTS holds each chunk's own tokens
and TRUNCATED is false (long documents run in windows, nothing is cut).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_ensemble.late_chunks import LateChunker
from rose_ensemble.tokenization import InputError, TextTokenizer

COUNT_OUTPUTS = ("TOKEN_COUNTS", "TRUNCATED")
COUNT_KINDS = frozenset({"token_counts", "truncated"})


@dataclass(slots=True)
class TextJob:
    texts: list[str] | None = None              # plain: the texts, each with the prompt in front
    cut: np.ndarray | None = None               # bool [n]: cut at max_text_bytes before tokenizing
    documents: list[list[str]] | None = None    # late chunking: each document's chunks
    prompt: str = ""                            # late chunking: put before each document
    counted: bool = False                       # also TOKEN_COUNTS and TRUNCATED


def wants_counts(parameter: str | None = None, requested=(), all_outputs=frozenset()) -> bool:
    """Whether a request asks for TOKEN_COUNTS / TRUNCATED: by the request parameter `outputs`
    (what reaches a step of the `embed` ensemble) or by naming them (a direct `tokenize` call). A
    request naming no outputs is given all of them by Triton (`requested` then holds every one of
    `all_outputs`): that asks for none of these."""
    if parameter:
        if COUNT_KINDS & {k.strip().lower() for k in str(parameter).split(",")}:
            return True
    requested = frozenset(requested)
    return bool(requested & set(COUNT_OUTPUTS)) and not (all_outputs and requested >= all_outputs)


def prompt_name_of(inputs: dict) -> str | None:
    task = inputs.get("TASK")
    if task is None:
        return None
    values = task.as_numpy().reshape(-1)
    if len(values) != 1:
        raise InputError(f"TASK must hold exactly one string, got {len(values)}")
    raw = values[0]
    return (raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)) or None


def read_text_job(inputs: dict, tokenizer: TextTokenizer, chunker: LateChunker | None, counted: bool) -> TextJob:
    """TEXT (+ TASK, DOC_CHUNKS) of a request's inputs -> its job; InputError naming what is wrong."""
    text = inputs.get("TEXT")
    if text is None:
        raise InputError("missing input TEXT")
    prompt = tokenizer.prompt_for(prompt_name_of(inputs))
    raw = text.as_numpy().reshape(-1)
    doc_chunks = inputs.get("DOC_CHUNKS")
    if doc_chunks is None:
        texts, cut = tokenizer.decode_texts_marked(raw)
        return TextJob([prompt + t for t in texts] if prompt else texts, cut, counted=counted)
    if chunker is None:
        raise InputError("DOC_CHUNKS (late chunking) is not available for this model")
    counts = doc_chunks.as_numpy()
    raw = [b.encode("utf-8") if isinstance(b, str) else bytes(b) for b in raw]
    chunker.split(raw, counts)                      # DOC_CHUNKS checked first
    chunker.check_sizes(raw, counts)
    chunks = tokenizer.decode_texts_marked(raw, allow_empty=True, cut_to=0)[0]
    return TextJob(documents=chunker.split(chunks, counts), prompt=prompt, counted=counted)


def encode_jobs(tokenizer: TextTokenizer, chunker: LateChunker | None, jobs: list[TextJob]) -> list:
    """Per job its [(name, array)] outputs, or the InputError that refuses it; plain jobs in one
    Rust call."""
    out: list = [None] * len(jobs)
    plain = [i for i, j in enumerate(jobs) if j.documents is None]
    if plain:
        encoded = tokenizer.encode_requests([jobs[i].texts for i in plain], [jobs[i].counted for i in plain])
        for i, res in zip(plain, encoded):
            outputs = [("INPUT_IDS", res[0]), ("SEQ_LENS", res[1])]
            if jobs[i].counted:
                outputs += [("TOKEN_COUNTS", res[2]), ("TRUNCATED", (res[2] > res[1]) | jobs[i].cut)]
            out[i] = outputs
    for i, job in enumerate(jobs):
        if job.documents is None:
            continue
        try:
            plan = chunker.plan(job.documents, job.prompt)
        except InputError as e:
            out[i] = e
            continue
        outputs = [("INPUT_IDS", plan.input_ids), ("SEQ_LENS", plan.seq_lens), ("TOKEN_CHUNKS", plan.token_chunks)]
        if job.counted:
            outputs += [("TOKEN_COUNTS", plan.chunk_tokens), ("TRUNCATED", np.zeros(plan.chunk_tokens.size, bool))]
        out[i] = outputs
    return out
