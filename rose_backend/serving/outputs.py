"""Per-request outputs beyond the dense rows: which ones a request asked for, and building them.

Outputs (all but EMBEDDINGS optional, computed only when asked for):
    EMBEDDINGS      [n, d] dense vectors, after DIMENSIONS and ENCODING (dtype follows ENCODING)
    SPARSE_IDS      INT32 [-1]   per input, its unique token ids with a weight > 0, inputs end to end
    SPARSE_WEIGHTS  FP32  [-1]   their lexical weights (max over the token's occurrences)
    SPARSE_LENS     INT32 [n]    how many ids each input has
    COLBERT         FP32  [-1, Dc]  per input, one unit vector per token but the first, end to end
    COLBERT_LENS    INT32 [n]    how many vectors each input has (its length - 1)
    TOKEN_COUNTS    INT32 [n]    each input's tokens before truncation (as the tokenizer counted them
                                 when `encode` tokenized the texts; else SEQ_LENS: rose cuts nothing)
    TRUNCATED       BOOL  [n]    whether each input was cut (likewise; else false)
Late chunking (TOKEN_CHUNKS in: serving/spans.py): n is the number of chunks, EMBEDDINGS holds one
span mean per chunk, TOKEN_COUNTS each chunk's own tokens and TRUNCATED is false.
Values as FlagEmbedding's BGEM3FlagModel.encode(return_sparse=True, return_colbert_vecs=True)
defines them (inference/embedder/encoder_only/m3.py, _process_token_weights and
_process_colbert_vecs): the sparse weights skip the tokenizer's cls / eos / pad / unk ids and keep
the largest weight of each id; ColBERT drops the first (CLS) token.

Cost: a request's token-level rows are taken piece by piece as its batches are collected
(collect_piece, EmbeddingService's on_piece), so on a GPU this host work overlaps the next batch's
forward pass: its sparse pairs at once, its ColBERT rows written once, straight into the request's
COLBERT array (one slice copy per sequence). build_outputs then only joins the small sparse parts.

Which outputs a request is sent: serving/output_choice.py (the names it gives Triton, or the request
parameter `outputs` where it cannot name them; a named output that cannot be sent is an error, never
left out).

DIMENSIONS (Matryoshka): the first d dimensions, normalized again if the model normalizes.
ENCODING: float32 (default), float16, int8, uint8, binary, ubinary, with the meaning and bit
layout of sentence-transformers' quantize_embeddings (binary: 8 dimensions a byte, np.packbits of
x > 0, minus 128 as int8; ubinary the same as uint8; int8 / uint8: floor((x - min) / step) with
step = (max - min) / 255 per dimension, clipped to 0..255, minus 128 for int8). int8 / uint8
need calibration ranges [2, d] (min row, max row) of the output's dimension d. EMBEDDINGS keeps its
name and takes the encoding's data type: Triton 2.51 passes a Python-backend output whose data
type differs from config.pbtxt's (FP32) on unchanged, through `rose` and the `embed` ensemble alike
(tests/server/test_m3_outputs.py, tests/server/test_output_options.py), so no extra typed outputs are needed.
DIMENSIONS applies to EMBEDDINGS only, not to the ColBERT vectors.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rose_backend.serving import spans
from rose_backend.serving.output_choice import (ALL_OUTPUTS, COLBERT_OUTPUTS, COUNT_OUTPUTS, DENSE,  # noqa: F401
                                               ENGINE_KINDS, KIND_OF, SPARSE_OUTPUTS, choose_outputs)

ENCODINGS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
RANGES_FILES = ("quantization_ranges.npy", "quantization_ranges.json")


@dataclass(frozen=True, slots=True)
class OutputOptions:
    names: frozenset                  # output tensors to send
    token_outputs: frozenset          # "sparse" / "colbert" / "hidden": what the engine must compute
    dimensions: int | None = None
    encoding: str = "float32"
    token_chunks: np.ndarray | None = None     # late chunking: int32 [T] chunk row per token, -1: none
    chunk_tokens: np.ndarray | None = None     # late chunking: int32 [n_chunks] tokens of each chunk
    token_counts: np.ndarray | None = None     # TOKEN_COUNTS as given (the tokenizer's), or None
    truncated: np.ndarray | None = None        # TRUNCATED as given, or None


def parse_options(requested, parameter: str | None, dimensions: np.ndarray | None, encoding: np.ndarray | None,
                  embedding_dim: int, ranges: np.ndarray | None, has_heads: bool,
                  declared=ALL_OUTPUTS, none_means: frozenset = DENSE) -> OutputOptions:
    """Check a request's output choices (declared, none_means: output_choice.choose_outputs); raise
    ValueError naming what is wrong."""
    names, token_outputs = choose_outputs(requested, parameter, declared, none_means)
    if token_outputs and not has_heads:
        named = ", ".join(sorted(n for n in names if KIND_OF.get(n) in token_outputs))
        raise ValueError(f"output {named}: {' and '.join(sorted(token_outputs))} outputs need BGE-M3's heads "
                         "(sparse_linear.pt and colbert_linear.pt, or .safetensors) in the model folder; "
                         "this model has none")
    dims = None
    if dimensions is not None:
        values = np.asarray(dimensions).reshape(-1)
        if values.size != 1 or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(f"DIMENSIONS must be one INT32 value, got {values.size} of {values.dtype}")
        dims = int(values[0])
        if not 1 <= dims <= embedding_dim:
            raise ValueError(f"DIMENSIONS is {dims}; this model's embeddings have 1..{embedding_dim} dimensions")
    enc = "float32"
    if encoding is not None:
        values = np.asarray(encoding, dtype=object).reshape(-1)
        if values.size != 1:
            raise ValueError(f"ENCODING must hold exactly one string, got {values.size}")
        raw = values[0]
        enc = (raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)).strip().lower() or "float32"
        if enc not in ENCODINGS:
            raise ValueError(f"ENCODING {enc!r} is not one of {', '.join(ENCODINGS)}")
    if enc in ("int8", "uint8"):
        d = dims or embedding_dim
        if ranges is None:
            raise ValueError(f"ENCODING {enc} needs calibration ranges: put {RANGES_FILES[0]} ([2, {d}]: the "
                             "minimum and maximum of each dimension) in the model folder, or set the rose "
                             "parameter quantization_ranges")
        if ranges.shape[1] != d:
            raise ValueError(f"ENCODING {enc}: the calibration ranges have {ranges.shape[1]} dimensions, "
                             f"the output {d}; send DIMENSIONS {ranges.shape[1]} or calibrate for {d}")
    return OutputOptions(names, token_outputs, dims, enc)


TOKEN_INPUTS = ("TOKEN_CHUNKS", "TOKEN_COUNTS", "TRUNCATED")     # rose's optional inputs read here


def refuse_token_inputs(inputs: dict) -> None:
    """A reranker scores pairs: late chunking and token counts are refused, never ignored."""
    given = [n for n in TOKEN_INPUTS if n in inputs]
    if given:
        raise ValueError(f"{', '.join(given)}: a reranker takes no late chunking or token counts")


def with_token_inputs(opts: OutputOptions, inputs: dict, seq_lens: np.ndarray, limits) -> OutputOptions:
    """opts with the request's TOKEN_CHUNKS (late chunking: the engine then returns hidden states),
    TOKEN_COUNTS and TRUNCATED checked and attached; `inputs` {name: array}; ValueError if bad."""
    if not inputs:                           # the common case: none of them
        return opts
    from dataclasses import replace
    from rose_backend.serving.validation import validate_counts, validate_token_chunks
    late = validate_token_chunks(inputs.get("TOKEN_CHUNKS"), int(seq_lens.sum(dtype=np.int64)), limits)
    if late is not None and opts.token_outputs:
        named = ", ".join(sorted(n for n in opts.names if KIND_OF.get(n) in opts.token_outputs))
        raise ValueError(f"output {named}: {' and '.join(sorted(opts.token_outputs))} outputs are not available "
                         "with late chunking (TOKEN_CHUNKS / DOC_CHUNKS): send those texts without it")
    counts, cut = validate_counts(inputs.get("TOKEN_COUNTS"), inputs.get("TRUNCATED"),
                                  seq_lens if late is None else late[1], late is not None)
    if late is None and counts is None and cut is None:
        return opts
    extra = {} if late is None else {"token_chunks": late[0], "chunk_tokens": late[1],
                                     "token_outputs": opts.token_outputs | {"hidden"}}
    return replace(opts, token_counts=counts, truncated=cut, **extra)


def load_ranges(path: str | Path | None, model_dir: str | Path) -> np.ndarray | None:
    """Calibration ranges [2, d] float32 from `path` (.npy or .json), else from the model folder's
    quantization_ranges.npy / .json, else None. `path` may name environment variables ($MODELS/r.npy)."""
    candidates = [Path(os.path.expandvars(str(path)))] if path else [Path(model_dir) / f for f in RANGES_FILES]
    for p in candidates:
        if not p.exists():
            if path:
                raise ValueError(f"quantization_ranges {p} does not exist")
            continue
        a = np.load(p) if p.suffix == ".npy" else np.asarray(json.loads(p.read_text()), dtype=np.float32)
        a = np.asarray(a, dtype=np.float32)
        if a.ndim != 2 or a.shape[0] != 2:
            raise ValueError(f"{p}: calibration ranges must be [2, d] (min row, max row), got {list(a.shape)}")
        return a
    return None


# ------------------------------------------------------------------------------------ building
def dense_output(emb: np.ndarray, opts: OutputOptions, normalize: bool, ranges: np.ndarray | None) -> np.ndarray:
    """EMBEDDINGS after DIMENSIONS and ENCODING."""
    if opts.dimensions is not None and opts.dimensions < emb.shape[1]:
        emb = emb[:, :opts.dimensions]
        if normalize:
            emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return quantize(np.ascontiguousarray(emb, dtype=np.float32), opts.encoding, ranges)


def quantize(emb: np.ndarray, encoding: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """sentence-transformers' quantize_embeddings (util/quantization.py), plus float16."""
    if encoding == "float32":
        return emb
    if encoding == "float16":
        return emb.astype(np.float16)
    if encoding in ("int8", "uint8"):
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q = np.clip(np.floor((emb - starts) / steps), 0, 255)
        return q.astype(np.uint8) if encoding == "uint8" else (q - 128).astype(np.int8)
    if encoding == "binary":
        return (np.packbits(emb > 0, axis=-1) - 128).astype(np.int8)
    if encoding == "ubinary":
        return np.packbits(emb > 0, axis=-1)
    raise ValueError(f"unknown encoding {encoding!r}")


def sparse_outputs(input_ids: np.ndarray, seq_lens: np.ndarray, weights: np.ndarray,
                   skip_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sequence, its unique token ids (ascending) with weight > 0 and the largest weight of
    each, skipping `skip_ids`: (ids int32 [-1], weights float32 [-1], lens int32 [S]).
    One sort of (sequence, id) keys, then the largest weight of each run (few numpy calls: at
    1 x 128 tokens the call overhead is the cost)."""
    keep = weights > 0
    for s in skip_ids.tolist():                      # a few ids: cheaper than np.isin's set-up
        keep &= input_ids != s
    w = weights[keep]
    if len(seq_lens) == 1:
        key = input_ids[keep].astype(np.int64)
    else:
        seq = np.repeat(np.arange(len(seq_lens), dtype=np.int64), seq_lens)
        key = (seq[keep] << 32) | input_ids[keep]
    if key.size == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(len(seq_lens), np.int32)
    order = np.argsort(key, kind="stable")
    key, w = key[order], w[order]
    first = np.empty(key.size, dtype=bool)
    first[0] = True
    np.not_equal(key[1:], key[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    uniq = key[starts]
    best = np.maximum.reduceat(w, starts).astype(np.float32, copy=False)
    if len(seq_lens) == 1:
        lens = np.array([uniq.size], dtype=np.int32)
    else:
        lens = np.bincount(uniq >> 32, minlength=len(seq_lens)).astype(np.int32)
    return (uniq & 0xFFFFFFFF).astype(np.int32), best, lens


def copy_without_first(rows: np.ndarray, seq_lens, out: np.ndarray) -> None:
    """rows [sum(seq_lens), Dc] of consecutive sequences -> out [sum(seq_lens) - len(seq_lens), Dc]:
    each sequence's rows but its first, one slice copy per sequence (twice np.compress's speed)."""
    src = dst = 0
    for n in seq_lens.tolist():
        out[dst:dst + n - 1] = rows[src + 1:src + n]
        src += n
        dst += n - 1


def colbert_outputs(vectors, seq_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every token's vector but each sequence's first: (COLBERT [T - S, Dc] f32, lens int32 [S]).
    `vectors`: [T, Dc], or its pieces [(first token, rows)] in any order, each of whole sequences."""
    pieces = [(0, vectors)] if isinstance(vectors, np.ndarray) else sorted(vectors, key=lambda p: p[0])
    cu = np.zeros(len(seq_lens) + 1, dtype=np.int64)
    np.cumsum(seq_lens, out=cu[1:])
    out = np.empty((int(cu[-1]) - len(seq_lens), pieces[0][1].shape[1]), dtype=np.float32)
    for t0, rows in pieces:
        first, last = np.searchsorted(cu, [t0, t0 + len(rows)])
        copy_without_first(rows, seq_lens[first:last], out[cu[first] - first:cu[last] - last])
    return out, (seq_lens - 1).astype(np.int32)


def collect_piece(request, first: int, last: int, rows: dict[str, np.ndarray], skip_ids: np.ndarray) -> None:
    """EmbeddingService's on_piece: take the token-level rows of sequences [first, last) of a request
    as their batch is collected (the rows are the engine's reused buffers: nothing is kept of them).
    Sparse: that piece's (ids, weights, lens) at once. ColBERT: written once, straight into the
    request's COLBERT array (a request in one piece of one sequence keeps a view instead: it is
    answered before the engine reuses the buffer)."""
    lens = request.seq_lens[first:last]
    t0, t1 = int(request.offsets[first]), int(request.offsets[last])
    res = request.token_results
    if "hidden" in rows:                                          # late chunking
        opts = request.options
        spans.add_piece(res, opts.token_chunks[t0:t1], rows["hidden"], opts.chunk_tokens.size)
    if "sparse" in rows:
        res.setdefault("sparse", []).append((first, *sparse_outputs(request.input_ids[t0:t1], lens, rows["sparse"],
                                                                   skip_ids)))
    if "colbert" in rows:
        vecs = rows["colbert"]
        if first == 0 and last == request.num_seqs == 1:
            res["colbert"] = vecs[1:]
            return
        out = res.get("colbert")
        if out is None:
            out = res["colbert"] = np.empty((request.num_tokens - request.num_seqs, vecs.shape[1]), dtype=np.float32)
        copy_without_first(vecs, lens, out[t0 - first:t1 - last])


def build_outputs(request, opts: OutputOptions, normalize: bool, ranges: np.ndarray | None) -> list[tuple[str, np.ndarray]]:
    """(name, array) pairs for one finished request (a scheduler.Request whose token-level results
    collect_piece took)."""
    out = []
    late = opts.token_chunks is not None
    if "EMBEDDINGS" in opts.names:
        rows = spans.chunk_means(request.token_results, opts.chunk_tokens, normalize) if late else request.output
        out.append(("EMBEDDINGS", dense_output(rows, opts, normalize, ranges)))
    if "TOKEN_COUNTS" in opts.names or "TRUNCATED" in opts.names:
        counts = opts.token_counts if opts.token_counts is not None else opts.chunk_tokens if late else request.seq_lens
        cut = opts.truncated
        if cut is None:
            cut = np.zeros(counts.size, dtype=bool) if late else counts > request.seq_lens
        out += [(n, a) for n, a in zip(COUNT_OUTPUTS, (counts.astype(np.int32), cut.astype(bool))) if n in opts.names]
    if "sparse" in opts.token_outputs:
        pieces = sorted(request.token_results["sparse"], key=lambda p: p[0])
        parts = pieces[0][1:] if len(pieces) == 1 else [np.concatenate(a) for a in zip(*(p[1:] for p in pieces))]
        out += [(n, a) for n, a in zip(SPARSE_OUTPUTS, parts) if n in opts.names]
    if "colbert" in opts.token_outputs:
        vecs, lens = request.token_results["colbert"], (request.seq_lens - 1).astype(np.int32)
        out += [(n, a) for n, a in zip(COLBERT_OUTPUTS, (vecs, lens)) if n in opts.names]
    return out


def special_token_ids(model_dir: str | Path) -> np.ndarray:
    """The ids BGE-M3's sparse output skips: the tokenizer's cls, eos, pad and unk tokens (as named
    in special_tokens_map.json / tokenizer_config.json), looked up in tokenizer.json."""
    from tokenizers import Tokenizer
    d = Path(model_dir)
    names: dict[str, str] = {}
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        if (d / f).exists():
            for k, v in json.loads((d / f).read_text()).items():
                if k in ("cls_token", "eos_token", "pad_token", "unk_token") and v:
                    names[k] = v["content"] if isinstance(v, dict) else str(v)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = [tok.token_to_id(t) for t in names.values()]
    return np.array(sorted({i for i in ids if i is not None}), dtype=np.int32)
