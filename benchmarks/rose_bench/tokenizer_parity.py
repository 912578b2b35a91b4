"""The tokenizers study's parity check: every candidate's ids against `tokenizers`' encode_batch on
every text, untruncated and truncated, batch and one text at a time; mismatch counts, the first
mismatch and a minimized mismatching text."""
from __future__ import annotations

import time
from pathlib import Path

from rose_bench.record import log
from rose_bench.tokenizer_adapters import ADAPTERS, REFERENCE, Unsupported, as_list

TRUNCATE = 512


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
