"""POST /v1/embeddings: OpenAI's request checked field by field, and its response built.

    {"input": "text" | ["text", ...] | [101, 2054, 102] | [[101, 102], ...], "model": "...",
     "dimensions": 128, "encoding_format": "float" | "base64",
     "task": "query", "truncate": true, "lane": "interactive" | "bulk",
     "late_chunking": true}                      <- rose's extensions; unknown fields are ignored

Integers are checked against the range the server takes before anything converts them (the
server's inputs are int32): `dimensions` 1 .. 2^31 - 1, token ids 0 .. 2^31 - 1; 400 naming the field.

`dimensions`: Matryoshka truncation. Texts: the server's DIMENSIONS input (the first d values,
normalised again when the model normalises). Token ids (the client sends `rose` no DIMENSIONS): the
gateway keeps the first d values and renormalises them, which matches the server only for a model
that normalises; for one that does not, the field is refused (400).
`encoding_format: base64`: each embedding as base64 of its little-endian float32 bytes (as OpenAI).
`truncate` (default true, rose's behaviour): texts over the model's max_seq_length tokens are cut
there (token-id inputs too); false refuses such an input with 400 naming it. Each `data` item of
an input that was cut carries `"truncated": true`.
`lane`: passed to `rose` as the request parameter "lane" (interactive work is scheduled before bulk).
`late_chunking`: `input` is the chunks of one document, in order (a list of strings); `data` has
one embedding per chunk, each pooled over its own tokens of the whole document's forward pass.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np
import orjson

from rose_client.contract import INT32_MAX, LANES
from rose_gateway.errors import bad_request, too_large

ENCODINGS = ("float", "base64")


@dataclass(slots=True)
class EmbeddingRequest:
    texts: list[str] | None             # exactly one of texts / token_lists is set
    token_lists: list[list[int]] | None
    model: str | None
    dimensions: int | None
    encoding_format: str
    task: str | None
    truncate: bool
    lane: str | None = None
    late_chunking: bool = False

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_lists)


def loads(raw: bytes) -> object:
    """A request body's JSON; 400 naming the body when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request("body", f"the request body is not valid JSON ({e})") from None


def parse_embedding_request(body: object, max_inputs: int) -> EmbeddingRequest:
    if not isinstance(body, dict):
        raise bad_request("body", "the request body must be a JSON object")
    if "input" not in body:
        raise bad_request("input", "missing field 'input' (a string, a list of strings, a list of token ids "
                                   "or a list of lists of token ids)")
    texts, token_lists = _parse_input(body["input"], max_inputs)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", f"'model' must be a string, got {_kind(model)}")
    dims = positive_int(body.get("dimensions"), "dimensions")
    enc = body.get("encoding_format") or "float"
    if enc not in ENCODINGS:
        raise bad_request("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {_show(enc)}")
    task = body.get("task")
    if task is not None and (not isinstance(task, str) or not task):
        raise bad_request("task", f"'task' must be a non-empty string (a prompt name), got {_show(task)}")
    truncate = _flag(body, "truncate", True)
    lane = lane_of(body)
    late = _flag(body, "late_chunking", False)
    if late and texts is None:
        raise bad_request("late_chunking", "'late_chunking' takes the chunks of one document as strings, "
                                           "not token ids")
    return EmbeddingRequest(texts, token_lists, model, dims, enc, task, truncate, lane, late)


def _parse_input(value, max_inputs: int) -> tuple[list[str] | None, list[list[int]] | None]:
    if isinstance(value, str):
        if not value:
            raise bad_request("input", "'input' is an empty string")
        return [value], None
    if not isinstance(value, list):
        raise bad_request("input", f"'input' must be a string or a list, got {_kind(value)}")
    if not value:
        raise bad_request("input", "'input' is an empty list: send at least one text")
    if _is_int(value[0]):                                     # one sequence of token ids
        _check_ids(value, "input")
        return None, [value]
    if len(value) > max_inputs:
        raise too_large("input", f"'input' has {len(value)} items; this gateway takes at most {max_inputs} "
                                 "per request (split the request)")
    if isinstance(value[0], str):
        for i, t in enumerate(value):
            if not isinstance(t, str):
                raise bad_request(f"input[{i}]", f"input[{i}] is {_kind(t)}; a list of texts must hold only strings")
            if not t:
                raise bad_request(f"input[{i}]", f"input[{i}] is an empty string")
        return value, None
    if isinstance(value[0], list):
        for i, ids in enumerate(value):
            if not isinstance(ids, list):
                raise bad_request(f"input[{i}]", f"input[{i}] is {_kind(ids)}; a list of token-id lists must "
                                                 "hold only lists of integers")
            _check_ids(ids, f"input[{i}]")
        return None, value
    raise bad_request("input[0]", f"input[0] is {_kind(value[0])}; 'input' must hold strings, integers "
                                  "(token ids) or lists of integers")


def _check_ids(ids: list, where: str) -> None:
    if not ids:
        raise bad_request(where, f"{where} is an empty list of token ids")
    for j, t in enumerate(ids):
        if not _is_int(t) or not 0 <= t <= INT32_MAX:
            raise bad_request(where, f"{where}[{j}] = {_show(t)} is not a token id (an integer from 0 to "
                                     f"{INT32_MAX})")


def positive_int(value, name: str) -> int | None:
    """An optional field that the server takes as int32 (null or absent: None); 400 naming it otherwise."""
    if value is not None and (not _is_int(value) or not 1 <= value <= INT32_MAX):
        raise bad_request(name, f"'{name}' must be a positive integer (at most {INT32_MAX}), got {_show(value)}")
    return value


def lane_of(body: dict) -> str | None:
    """The request's `lane` (rose's extension; absent: None); 400 naming it when it is none of LANES."""
    lane = body.get("lane")
    if lane is not None and lane not in LANES:
        raise bad_request("lane", f"'lane' must be {' or '.join(map(repr, LANES))}, got {_show(lane)}")
    return lane


def _show(v) -> str:
    """A JSON value for an error message, cut to 40 characters."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def check_dimensions(dims: int | None, normalizes: bool) -> None:
    """Before the call: a model that does not normalise has no Matryoshka truncation here."""
    if dims is not None and not normalizes:
        raise bad_request("dimensions", "'dimensions' is not supported for this model: it does not normalise its "
                                        "embeddings, so a truncated one has no defined scale (omit 'dimensions')")


def cut_dimensions(emb: np.ndarray, dims: int | None, normalizes: bool) -> np.ndarray:
    """Matryoshka truncation to `dims` values, renormalised to unit length. emb: float32 [n, D]."""
    check_dimensions(dims, normalizes)
    if dims is None or dims == emb.shape[1]:
        return emb
    if dims > emb.shape[1]:
        raise bad_request("dimensions", f"'dimensions' is {dims}; this model's embeddings have {emb.shape[1]}")
    out = emb[:, :dims]
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)


def embedding_response(emb: np.ndarray, encoding: str, model: str, prompt_tokens: int,
                       truncated: np.ndarray | None = None) -> bytes:
    """OpenAI's response body; `"truncated": true` on the items whose input was cut. Floats are
    written by orjson straight from the float32 array: the shortest text that reads back as the
    same float32, with no Python float per element (json.dumps would need them)."""
    if encoding == "base64":
        le = emb.astype("<f4", copy=False)
        rows = [base64.b64encode(le[i].tobytes()).decode("ascii") for i in range(len(le))]
    else:
        rows = list(emb)                                   # float32 [D] views, serialised by orjson
    data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    if truncated is not None:
        for i in np.flatnonzero(truncated).tolist():
            data[i]["truncated"] = True
    return orjson.dumps({"object": "list", "data": data,
                         "model": model, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def _flag(body: dict, name: str, default: bool) -> bool:
    """A boolean field of the request (null or absent: `default`); 400 naming it otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(name, f"'{name}' must be true or false, got {_show(value)}")
    return value
