"""The end-to-end bench's modes (requests per cell of each workload), the systems it compares and
the model each system takes token ids / texts on; the multi-GPU bench derives its counts from these.
"""
from __future__ import annotations

GATE_MAX_COS_DIST = 1e-3
FP8_GATE_MAX_COS_DIST = 5e-3          # under dtype=fp8 (the README's fp8 gate; rose_bench fp8-accuracy)

MODES = {
    "full": dict(online=(128, 512, 4096), online_n=2000, online_warmup=50,
                 scoring=(5, 25, 50), scoring_len=512, scoring_n=500, scoring_warmup=10,
                 throughput=(512, 1024, 4096), tput_batch=100, tput_procs=4,
                 tput_batches={512: 20, 1024: 10, 4096: 3}, tput_warmup=1,
                 concurrency=(1, 2, 4, 8, 16), conc_len=512, conc_total=2000, conc_warmup=5,
                 gate_lengths=(128, 512, 4096, 37, 1000), pa_interval_ms=5000),
    "quick": dict(online=(128, 512, 4096), online_n=300, online_warmup=20,
                  scoring=(5, 25, 50), scoring_len=512, scoring_n=100, scoring_warmup=5,
                  throughput=(512, 1024, 4096), tput_batch=100, tput_procs=4,
                  tput_batches={512: 5, 1024: 3, 4096: 2}, tput_warmup=1,
                  concurrency=(1, 2, 4, 8, 16), conc_len=512, conc_total=256, conc_warmup=3,
                  gate_lengths=(128, 512, 4096, 37, 1000), pa_interval_ms=1000),
    # the CPU test of the tool itself: tiny shapes, one cell of each workload, a handful of requests
    # (numbers mean nothing)
    "tiny": dict(online=(16,), online_n=10, online_warmup=2,
                 scoring=(2,), scoring_len=32, scoring_n=5, scoring_warmup=1,
                 throughput=(16,), tput_batch=4, tput_procs=2, tput_batches={16: 2}, tput_warmup=1,
                 concurrency=(2,), conc_len=32, conc_total=8, conc_warmup=1,
                 gate_lengths=(5, 17, 64, 100), pa_interval_ms=500),
}
# The servers of the CPU smokes (the tiny mode, and multi-gpu --cpu-smoke) run one instance of each
# tokenize model, as the test servers do (tests/support/server.py): the same path through the tool,
# and each server starts about half a second and stops a second or two sooner.
SMOKE_INSTANCES = {"tokenize": 1, "tokenize_batched": 1}
SYSTEM_MODELS = {"rose": ("tokenize", "tokenize_batched", "rose", "embed"), "naive": ("naive",)}
TOKEN_MODEL = {"rose": "rose", "naive": "naive"}
TEXT_MODEL = {"rose": "embed", "naive": "naive"}
# The naive model runs on the interpreter's own numpy (no numpy<2 stub site: transformers' imports
# need numpy 2 there); Triton 2.51's backend cannot read BYTES under numpy 2 (its stub crashes),
# so on such a machine the naive system is measured on token ids only.
NAIVE_TEXT_SKIPPED = "skipped: Triton 2.51's Python backend cannot read BYTES inputs under numpy 2"
