"""TEI requests as rose reads them: `inputs` (texts and token-id lists), the flags and options of
TEI's embedding routes, TEI's order of rerank scores, and the JSON it answers (tei.py serves them)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from rose_client.contract import INT32_MAX
from rose_gateway.embeddings import _is_int, _kind, _show, lane_of
from rose_gateway.errors import bad_request, empty_batch, too_large

DIRECTIONS = {"right": False, "Right": False, "left": True, "Left": True}    # -> truncate on the left


@dataclass(slots=True)
class TeiInputs:
    """A TEI request's `inputs`: texts and token-id lists in their order, and its options."""
    items: list                     # str or list[int] each
    truncate: bool
    left: bool                      # truncation_direction left
    prompt_name: str | None
    lane: str | None

    @property
    def texts_only(self) -> bool:
        return all(isinstance(x, str) for x in self.items)


def parse_inputs(body: object, max_inputs: int, name: str = "inputs") -> TeiInputs:
    """TEI's Input: a string, one list of token ids, or a list of strings and token-id lists."""
    if not isinstance(body, dict):
        raise bad_request("body", "the request body must be a JSON object")
    if name not in body:
        raise bad_request(name, f"missing field `{name}` (a string, a list of token ids, or a list of strings "
                                "and token-id lists)")
    value = body[name]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list) and value and _is_int(value[0]):
        items = [value]                                       # one sequence of token ids
    elif isinstance(value, list):
        items = value
    else:
        raise bad_request(name, f"`{name}` must be a string or a list, got {_kind(value)}")
    if not items:
        raise empty_batch(name)
    if len(items) > max_inputs:
        raise too_large(name, f"batch size {len(items)} > maximum allowed batch size {max_inputs}")
    for i, x in enumerate(items):
        where = name if len(items) == 1 and value is not items else f"{name}[{i}]"
        if isinstance(x, str):
            if not x:
                raise empty_batch(where)
        elif isinstance(x, list):
            if not x:
                raise empty_batch(where)
            for j, t in enumerate(x):
                if not _is_int(t) or not 0 <= t <= INT32_MAX:
                    raise bad_request(where, f"{where}[{j}] = {_show(t)} is not a token id (an integer from 0 to "
                                             f"{INT32_MAX})")
        else:
            raise bad_request(where, f"{where} is {_kind(x)}; `{name}` holds strings and lists of token ids")
    return TeiInputs(items, flag(body, "truncate", True), direction(body), prompt_name(body), lane_of(body))


def flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(name, f"`{name}` must be true or false, got {_show(value)}")
    return value


def direction(body: dict) -> bool:
    """truncation_direction: True for left."""
    value = body.get("truncation_direction")
    if value is None:
        return False
    if value not in DIRECTIONS:
        raise bad_request("truncation_direction", f"`truncation_direction` must be \"right\" or \"left\", got "
                                                  f"{_show(value)}")
    return DIRECTIONS[value]


def prompt_name(body: dict) -> str | None:
    value = body.get("prompt_name")
    if value is not None and (not isinstance(value, str) or not value):
        raise bad_request("prompt_name", f"`prompt_name` must be a non-empty string, got {_show(value)}")
    return value


def dimensions(body: dict) -> int | None:
    value = body.get("dimensions")
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise bad_request("dimensions", f"`dimensions` should be a positive integer, got {_show(value)}")
    return value


def tei_order(scores: np.ndarray) -> list[int]:
    """Best first, as TEI orders: a stable ascending sort, reversed (of equal scores the later index first)."""
    return np.argsort(scores, kind="stable")[::-1].tolist()


def unit_rows(emb: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return np.ascontiguousarray(emb / np.maximum(norms, 1e-12), dtype=np.float32)


def dumps(value) -> bytes:
    """JSON of lists, dicts and float32 arrays (orjson writes an array's floats straight from it)."""
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
