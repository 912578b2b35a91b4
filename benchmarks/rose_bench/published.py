"""The peers' numbers (H200, bf16) and this project's goals, as docs/DESIGN.md (Benchmarks) describes them.

PUBLISHED: vLLM 0.22.0 and Perplexity's engine "Tulip" as Perplexity's post published them; the
concurrency chart was an unlabelled line plot, so those values are read off it and approximate.
Latencies in ms, p50 with p99 where published; throughput in embeddings per second. Keys: model ->
workload -> x -> row. SENTENCE_TRANSFORMERS: the Python library a team reaches for first, measured
in process (not published).
"""
from __future__ import annotations

MODEL_TITLES = {"bge-m3": "BGE-M3", "pplx-embed": "pplx-embed-1-0.6b"}

PUBLISHED: dict[str, dict[str, dict[int, dict]]] = {
    "bge-m3": {
        "online": {128: {"vllm": (4.60, 7.96), "tulip": (1.53, 1.67), "goal": (0.70, None)},
                   512: {"vllm": (4.65, 6.06), "tulip": (2.03, 2.17), "goal": (1.20, None)},
                   4096: {"vllm": (11.71, 13.20), "tulip": (9.57, 10.56), "goal": (7.5, None)}},
        "scoring": {5: {"vllm": (9.60, 11.55), "tulip": (6.17, 6.48), "goal": (3.5, None)},
                    25: {"vllm": (26.59, 30.66), "tulip": (22.43, 23.54), "goal": (16.0, None)},
                    50: {"vllm": (47.29, 51.04), "tulip": (40.45, 43.77), "goal": (30.0, None)}},
        "throughput": {512: {"vllm": 1342.2, "tulip": 1499.3, "goal": 1900.0},
                       1024: {"vllm": 622.5, "tulip": 691.5, "goal": 850.0},
                       4096: {"vllm": 116.6, "tulip": 125.4, "goal": 140.0}},
        "concurrency": {1: {"vllm": (12.5, 15.0), "tulip": (3.0, 3.5), "goal": (None, None)},
                        16: {"vllm": (23.0, 32.0), "tulip": (16.5, 19.0), "goal": (10.0, 13.0)}},
    },
    "pplx-embed": {
        "online": {128: {"vllm": (4.94, 7.94), "tulip": (1.88, 2.26), "goal": (0.90, None)},
                   512: {"vllm": (4.98, 5.98), "tulip": (2.75, 3.09), "goal": (1.40, None)},
                   4096: {"vllm": (16.15, 17.54), "tulip": (15.41, 16.32), "goal": (12.0, None)}},
        "scoring": {5: {"vllm": (13.93, 24.24), "tulip": (9.51, 10.21), "goal": (5.0, None)},
                    25: {"vllm": (35.04, 40.41), "tulip": (34.34, 36.29), "goal": (25.0, None)},
                    50: {"vllm": (63.68, 69.06), "tulip": (60.96, 64.51), "goal": (48.0, None)}},
        "throughput": {512: {"vllm": 902.3, "tulip": 926.7, "goal": 1150.0},
                       1024: {"vllm": 423.3, "tulip": 422.8, "goal": 520.0},
                       4096: {"vllm": 73.5, "tulip": 72.2, "goal": 85.0}},
        "concurrency": {1: {"vllm": (11.5, 12.5), "tulip": (3.75, 4.0), "goal": (None, None)},
                        16: {"vllm": (32.0, 50.0), "tulip": (25.0, 35.5), "goal": (None, None)}},
    },
}
APPROXIMATE = {"concurrency"}           # read off a line chart

# sentence-transformers 6 in process (no server) on the same random-weight folders as rose's runs,
# measured on one H200 on 2026-12-05: p50 ms, throughput in embeddings/s. Not a published number, and
# the run's own record is not in this repository. A cell it was not measured on is absent.
SENTENCE_TRANSFORMERS_DATE = "2026-12-05"
SENTENCE_TRANSFORMERS: dict[str, dict[str, dict[int, float]]] = {
    "bge-m3": {"online": {128: 13.1, 512: 13.4, 4096: 21.1},
               "scoring": {5: 28.7, 25: 40.0, 50: 68.7},
               "throughput": {512: 807.0, 1024: 415.0, 4096: 80.0}},
    "pplx-embed": {"online": {128: 51.0, 512: 30.0, 4096: 39.0},
                   "throughput": {512: 337.0, 1024: 177.0, 4096: 39.0}},
}


def published(model: str) -> dict:
    return PUBLISHED.get(model, {})


def as_json(model: str) -> dict:
    """The published rows of one model with string keys (JSON)."""
    out = {}
    for workload, rows in published(model).items():
        out[workload] = {str(x): {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items()}
                         for x, row in rows.items()}
        if workload in APPROXIMATE:
            out[workload]["note"] = "read off the published line chart; approximate"
    return out
