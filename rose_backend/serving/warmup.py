"""What `rose` warms up in initialize(), before Triton reports it READY.

On a GPU the first batch of a configuration compiles kernels (flashinfer JIT, Triton-language
kernels) and the second captures its CUDA graph; a server that reported READY before that would make
its first users wait (docs/OPERATIONS.md, "Ready means ready"). The
compiled kernels persist in the compile-cache folder (rose_backend/launch/supervision.py: cache_env), so a
restart on the same machine only captures.
"""
from __future__ import annotations

DEFAULT_GPU_PRECAPTURE = "1:64,1:128,1:256,1:512,2:1024,4:2048,8:4096,16:8192,64:16384"
DEFAULT_CPU_PRECAPTURE = "1:8"


def precapture_plan(value: str, cuda: bool, max_tokens: int, max_seqs: int, max_len: int) -> list[tuple[int, int]]:
    """The (seqs, tokens) configurations to warm up at start-up: parameter `precapture` ("" = the
    default for the device, "none" = none), each fitted to the engine's limits (at most
    `max_tokens` tokens and `max_seqs` sequences of at most `max_len` tokens), duplicates dropped."""
    value = value.strip()
    if value.lower() == "none":
        return []
    plan = []
    for seqs, tokens in parse_precapture(value or (DEFAULT_GPU_PRECAPTURE if cuda else DEFAULT_CPU_PRECAPTURE)):
        tokens = min(tokens, max_tokens)
        seqs = min(max(seqs, -(-tokens // max_len)), max_seqs)
        tokens = min(tokens, seqs * max_len)
        if (seqs, tokens) not in plan:
            plan.append((seqs, tokens))
    return plan


def query_lane_plan(warm: list[tuple[int, int]], bulk_threshold_tokens: int) -> list[tuple[int, int]]:
    """What the query lane's engine (serving/query_lane.py) warms up of the main engine's list: the
    one-sequence configurations an interactive request can take (at most bulk_threshold_tokens), the
    lone queries that meet bulk work. Other interactive shapes run eagerly at first sight and are
    captured at their second, as on the main engine, so the second engine adds few captures to READY."""
    return [(s, t) for s, t in warm if s == 1 and t <= bulk_threshold_tokens]


def parse_precapture(value: str) -> list[tuple[int, int]]:
    """Parameter `precapture` as [(seqs, tokens), ...] ("none" and "" give [])."""
    out = []
    if value.strip().lower() == "none":
        return out
    for item in filter(None, (v.strip() for v in value.split(","))):
        try:
            seqs, tokens = (int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"model 'rose': parameter 'precapture' takes seqs:tokens pairs like "
                             f"1:128,8:4096 (or none); got {item!r}") from None
        out.append((seqs, tokens))
    return out


def cap_gpu_memory(device: str, headroom_mb: int, torch) -> float | None:
    """Parameter gpu_memory_headroom_mb (after warm-up): cap this process's CUDA memory at what it
    has reserved plus `headroom_mb` MiB, so that a batch needing more runs out of memory (and is
    split and retried by the service). Returns the fraction set, or None."""
    if not headroom_mb or not device.startswith("cuda"):
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(device) + headroom_mb * (1 << 20)) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction
