"""What TEI asks of the served model itself: POST /tokenize and POST /decode on the gateway's
tokenizer (tokens.py), and GET /info."""
from __future__ import annotations

import importlib.metadata

import numpy as np

from rose_gateway.embeddings import _is_int, _kind, _show
from rose_gateway.errors import ApiError, bad_request, empty_batch, too_large
from rose_gateway.tei_requests import dumps, flag, prompt_name

POOLING_NAMES = {"lasttoken": "last_token"}                                    # rose's name -> TEI's


def tokenize(gw, body: object) -> bytes:
    """TEI's POST /tokenize: each text's tokens (prompt_name's prompt first), as SimpleToken lists."""
    if not isinstance(body, dict):
        raise bad_request("body", "the request body must be a JSON object")
    inputs = body.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or any(not isinstance(t, str) for t in texts):
        raise bad_request("inputs", "`inputs` must be a string or a list of strings")
    if not texts:
        raise empty_batch("inputs")
    if len(texts) > gw.settings.max_inputs:
        raise too_large("inputs", f"batch size {len(texts)} > maximum allowed batch size "
                                  f"{gw.settings.max_inputs}")
    special = flag(body, "add_special_tokens", True)
    model = gw.model
    try:
        model.check_task(prompt_name(body))
        prompt = model.tokenizer.prompt_for(prompt_name(body))
    except (ApiError, ValueError) as e:
        raise bad_request("prompt_name", str(e).replace("task / prompt name", "prompt_name")) from None
    if prompt:
        texts = [prompt + t for t in texts]
    encodings = model.untruncated().encode_batch(texts, add_special_tokens=special)
    return dumps([_simple_tokens(e, t) for e, t in zip(encodings, texts)])

def decode(gw, body: object) -> bytes:
    """TEI's POST /decode: the text of each list of token ids."""
    if not isinstance(body, dict):
        raise bad_request("body", "the request body must be a JSON object")
    ids = body.get("ids")
    if not isinstance(ids, list):
        raise bad_request("ids", "missing field `ids` (a list of token ids, or a list of such lists)"
                          if ids is None else f"`ids` must be a list, got {_kind(ids)}")
    if not ids:
        raise empty_batch("ids")
    batch = ids if isinstance(ids[0], list) else [ids]
    if len(batch) > gw.settings.max_inputs:
        raise too_large("ids", f"batch size {len(batch)} > maximum allowed batch size "
                               f"{gw.settings.max_inputs}")
    tok = gw.model.untruncated()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    for i, one in enumerate(batch):
        if not isinstance(one, list):
            raise bad_request(f"ids[{i}]", f"ids[{i}] is {_kind(one)}; a batch of ids holds lists of token ids")
        if not one:
            raise empty_batch(f"ids[{i}]")
        for j, t in enumerate(one):
            if not _is_int(t) or not 0 <= t < vocab:
                raise bad_request(f"ids[{i}]", f"ids[{i}][{j}] = {_show(t)} is not a token id of this model "
                                               f"(0 to {vocab - 1})")
    skip = flag(body, "skip_special_tokens", True)
    return dumps(tok.decode_batch(batch, skip_special_tokens=skip))


def _simple_tokens(encoding, text: str) -> list[dict]:
    """TEI's SimpleToken list: special tokens with their token text and no offsets, the others with
    the text they cover and its byte offsets in `text` (TEI's offsets are the Rust tokenizer's bytes)."""
    ascii_only = text.isascii()
    if not ascii_only:
        to_byte = np.zeros(len(text) + 1, np.int64)
        np.cumsum([len(c.encode("utf-8")) for c in text], out=to_byte[1:])
    out = []
    for i, (tid, (a, b), sp, tok) in enumerate(zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask,
                                                   encoding.tokens)):
        if sp:
            out.append({"id": tid, "text": tok, "special": True, "start": None, "stop": None})
        else:
            start, stop = (a, b) if ascii_only else (int(to_byte[a]), int(to_byte[b]))
            out.append({"id": tid, "text": text[a:b], "special": False, "start": start, "stop": stop})
    return out


def info(gw, params: dict, version: str) -> dict:
    """TEI's Info: the served model and the limits (`params`: the `rose` model's parameters)."""
    model, s = gw.model, gw.settings
    cfg = model.config
    if model.is_embedding:
        kind = {"embedding": {"pooling": POOLING_NAMES.get(cfg.pooling, cfg.pooling)}}
    else:
        id2label = {str(k): str(v) for k, v in (cfg.raw.get("id2label") or {"0": "LABEL_0"}).items()}
        kind = {"reranker": {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
    batch_tokens = params.get("max_batch_tokens")
    from rose_gateway.protocol import default_max_connections
    return {
        "model_id": model.name, "model_sha": None,
        "model_dtype": params.get("dtype") or "auto",
        "served_model_name": gw.name, "model_type": kind,
        "max_concurrent_requests": default_max_connections(s.max_connections),
        "max_input_length": model.max_seq_length,
        "max_batch_tokens": int(batch_tokens) if batch_tokens and batch_tokens.isdigit() else s.max_request_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": s.max_inputs,
        "auto_truncate": True,
        "tokenization_workers": s.workers,
        "version": version, "sha": None, "docker_label": None,
    }


def version() -> str:
    try:
        return importlib.metadata.version("rose-embeddings")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0"
