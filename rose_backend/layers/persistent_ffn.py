"""The FFN block at small token counts as one persistent kernel, in OpenAI's triton language (a
prototype to measure against the three kernels of layers/projection.py and fused_kernels.py; no
model calls it):

    y = persistent_ffn(x, up_w, up_b, down_w, down_b, residual, norm_w, norm_b, eps, act, norm_kind)

y = norm(residual + down(act(up(x)))) for x [M, H] (bf16 / fp16, M <= 256), in three phases of one
launch of at most one program per SM, a grid barrier between them:

    1  h = act(x @ up_w.T + up_b)     tiles of [M, I]                 -> scratch h [M, I] (x's dtype)
    2  h @ down_w.T, split-K           tiles of [M, H] x S splits      -> scratch parts [S, M, H] fp32
    3  rows: sum(parts) + down_b + residual, then the norm             -> y [M, H]

act is "gelu" (exact erf), "gelu_tanh", "none" (up_w [I, H]) or "swiglu" (up_w: gate rows, then up
rows, [2I, H]; silu(gate) * up); norm_kind "layer" (norm_w, norm_b) or "rms" (norm_w). The norms are
fused_kernels._parts_norm_kernel's: float32 statistics of the unrounded sum; `residual_out` (the
residual itself for in place, as parts_add_rmsnorm_ does) receives that sum where given.

phased=True launches the same kernel three times (PHASE 1, 2, 3; stream order instead of barriers).
That is how Triton's interpreter tests the math on the CPU (it runs programs one after another, so
a barrier would wait forever there), and a fallback. Kernels take part in programmatic dependent
launch as layers/small_gemm.py says: each program pulls its weights into L2 before it waits.
"""
from __future__ import annotations

import os
import time

import torch
import triton
import triton.language as tl

from rose_backend.layers import small_gemm
from rose_backend.layers.small_gemm import _prefetch_rows, pdl_wait

ACTS = small_gemm.ACTS
MAX_TOKENS = 256
_SMS: dict[int, int] = {}

# The grid barrier. Programs are co-resident (grid <= SMs, so none waits for another to leave an SM)
# and each barrier has its own int32 counter, zero at launch:
#   arrive  bar.sync (every thread's stores of this program are ordered before thread 0's next
#           step), then one atomic add by thread 0, acq_rel at gpu scope: a release of them;
#   wait    thread 0 re-reads the counter with acquire loads until all programs have arrived, then
#           bar.sync: the acquire that saw the last arrival orders every program's stores before
#           this program's later loads (as cooperative groups' grid.sync, with the fences in the
#           atomics). Those loads of other programs' data use .cg (L2; L1 is not coherent).
# Reuse (CUDA graph replays with fixed arguments; calls in stream order sharing a workspace): the
# last program to arrive at barrier 2 zeroes counter 0: each program's last read of counter 0 comes
# before its own arrival at barrier 2, which that program's acq_rel add has seen, so no wait at
# barrier 1 can read the zero. After barrier 2 each program adds 1 to counter 2 (acq_rel, after its
# last read of counter 1), and the last of them zeroes counters 1 and 2 by the same argument. The
# next launch starts after this one has completed (stream order; under PDL griddepcontrol.wait,
# before any counter is touched), so it finds all three at zero. A launch that never finished leaves
# them dirty: use a new workspace.
# Co-residency: under PDL the kernel after this one starts only once every program here has passed
# griddepcontrol.launch_dependents, so all of them are resident by then. What the grid bound cannot
# see: kernels of other streams or processes (MPS) that hold SMs and never finish, e.g. a second
# persistent kernel at the same time. config coop=True asks the driver for the guarantee instead (a
# cooperative launch: it refuses a grid too large to be co-resident).


@triton.jit
def _grid_barrier(ctr_ptr, nprog):
    """Wait until all nprog programs have arrived at *ctr_ptr; returns this program's arrival index."""
    tl.debug_barrier()
    arrived = tl.atomic_add(ctr_ptr, 1, sem="acq_rel", scope="gpu")
    seen = arrived + 1
    while seen < nprog:
        seen = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    return arrived


@triton.jit
def _act(acc, up, ACT: tl.constexpr):
    if ACT == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    if ACT == 2:
        acc = acc / (1.0 + tl.exp(-acc)) * up
    if ACT == 3:              # tanh(u) = 2 sigmoid(2u) - 1
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (2.0 / (1.0 + tl.exp(-2.0 * u)))
    return acc


@triton.jit
def _up_phase(x_ptr, wu_ptr, bu_ptr, h_ptr, M, H, I, stride_x, pid, nprog, ACT: tl.constexpr,
              HAS_B: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    tiles_n = I // BN
    rk = tl.arange(0, BK)
    for t in range(pid, tl.cdiv(M, BM) * tiles_n, nprog):
        rm = (t // tiles_n) * BM + tl.arange(0, BM)
        rn = (t % tiles_n) * BN + tl.arange(0, BN)
        m_ok = rm[:, None] < M
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :]
        w_ptrs = wu_ptr + rn[None, :].to(tl.int64) * H + rk[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        up = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, H, BK):
            a = tl.load(x_ptrs, mask=m_ok, other=0.0)
            acc = tl.dot(a, tl.load(w_ptrs), acc)
            if ACT == 2:
                up = tl.dot(a, tl.load(w_ptrs + I * H), up)
            x_ptrs += BK
            w_ptrs += BK
        if HAS_B:
            acc += tl.load(bu_ptr + rn).to(tl.float32)[None, :]
            if ACT == 2:
                up += tl.load(bu_ptr + I + rn).to(tl.float32)[None, :]
        acc = _act(acc, up, ACT)
        tl.store(h_ptr + rm[:, None].to(tl.int64) * I + rn[None, :], acc.to(h_ptr.dtype.element_ty), mask=m_ok)


@triton.jit
def _down_phase(h_ptr, wd_ptr, p_ptr, M, H, I, pid, nprog, SPLITS: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr):
    tiles_n = H // BN
    tiles_mn = tl.cdiv(M, BM) * tiles_n
    k_per = I // SPLITS
    rk = tl.arange(0, BK)
    for t in range(pid, tiles_mn * SPLITS, nprog):
        s = t // tiles_mn
        rm = ((t % tiles_mn) // tiles_n) * BM + tl.arange(0, BM)
        rn = (t % tiles_n) * BN + tl.arange(0, BN)
        m_ok = rm[:, None] < M
        k0 = tl.multiple_of(s * k_per, BK)           # whole BK blocks (the wrapper checks): 16-byte loads
        h_ptrs = h_ptr + rm[:, None].to(tl.int64) * I + (k0 + rk)[None, :]
        w_ptrs = wd_ptr + rn[None, :].to(tl.int64) * I + (k0 + rk)[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, k_per, BK):
            acc = tl.dot(tl.load(h_ptrs, mask=m_ok, other=0.0, cache_modifier=".cg"), tl.load(w_ptrs), acc)
            h_ptrs += BK
            w_ptrs += BK
        out = p_ptr + (s * M).to(tl.int64) * H + rm[:, None].to(tl.int64) * H + rn[None, :]
        tl.store(out, acc, mask=m_ok)


@triton.jit
def _norm_phase(p_ptr, bd_ptr, r_ptr, nw_ptr, nb_ptr, y_ptr, ro_ptr, M, H, eps, stride_r, stride_y, stride_ro,
                pid, nprog, HAS_B: tl.constexpr, RMS: tl.constexpr, RES_OUT: tl.constexpr,
                SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for row in range(pid, M, nprog):
        r64 = tl.full((), row, tl.int64)
        x = tl.load(r_ptr + r64 * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        for s in tl.static_range(SPLITS):
            x += tl.load(p_ptr + (s * M + r64) * H + cols, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_B:
            x += tl.load(bd_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if RES_OUT:
            tl.store(ro_ptr + r64 * stride_ro + cols, x.to(ro_ptr.dtype.element_ty), mask=mask)
        if RMS:
            y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)) * w
        else:
            d = tl.where(mask, x - tl.sum(x, axis=0) / H, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / H + eps)
            y = d * rstd * w + tl.load(nb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + r64 * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _ffn_kernel(x_ptr, wu_ptr, bu_ptr, wd_ptr, bd_ptr, r_ptr, nw_ptr, nb_ptr, y_ptr, ro_ptr, h_ptr, p_ptr, ctr_ptr,
                M, H, I, eps, stride_x, stride_r, stride_y, stride_ro,
                ACT: tl.constexpr, HAS_UB: tl.constexpr, HAS_DB: tl.constexpr, RMS: tl.constexpr,
                RES_OUT: tl.constexpr, PHASE: tl.constexpr, SPLITS: tl.constexpr, PREFETCH: tl.constexpr,
                LINES_UP: tl.constexpr, LINES_DOWN: tl.constexpr, PDL: tl.constexpr,
                BM1: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr, BM2: tl.constexpr, BN2: tl.constexpr,
                BK2: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # weights do not depend on the kernel before: pull this program's rows into L2 (bit 1: up, bit 2: down)
    if (PREFETCH & 1) and (PHASE == 0 or PHASE == 1):
        for t in range(pid, tl.cdiv(M, BM1) * (I // BN1), nprog):
            rows = (t % (I // BN1)) * BN1 + tl.arange(0, BN1)
            _prefetch_rows(wu_ptr, rows, H, 0, H, LINES_UP)
            if ACT == 2:
                _prefetch_rows(wu_ptr, rows + I, H, 0, H, LINES_UP)
    if (PREFETCH & 2) and (PHASE == 0 or PHASE == 2):
        for t in range(pid, tl.cdiv(M, BM2) * (H // BN2) * SPLITS, nprog):
            rows = (t % (H // BN2)) * BN2 + tl.arange(0, BN2)
            k_per = I // SPLITS
            _prefetch_rows(wd_ptr, rows, I, (t // (tl.cdiv(M, BM2) * (H // BN2))) * k_per, k_per, LINES_DOWN)
    pdl_wait(PDL)
    if PHASE == 0 or PHASE == 1:
        _up_phase(x_ptr, wu_ptr, bu_ptr, h_ptr, M, H, I, stride_x, pid, nprog, ACT, HAS_UB, BM1, BN1, BK1)
    if PHASE == 0:
        _grid_barrier(ctr_ptr, nprog)
    if PHASE == 0 or PHASE == 2:
        _down_phase(h_ptr, wd_ptr, p_ptr, M, H, I, pid, nprog, SPLITS, BM2, BN2, BK2)
    if PHASE == 0:
        if _grid_barrier(ctr_ptr + 1, nprog) == nprog - 1:
            tl.atomic_xchg(ctr_ptr, 0, sem="acq_rel", scope="gpu")
        if tl.atomic_add(ctr_ptr + 2, 1, sem="acq_rel", scope="gpu") == nprog - 1:
            tl.atomic_xchg(ctr_ptr + 1, 0, sem="acq_rel", scope="gpu")
            tl.atomic_xchg(ctr_ptr + 2, 0, sem="acq_rel", scope="gpu")
    if PHASE == 0 or PHASE == 3:
        _norm_phase(p_ptr, bd_ptr, r_ptr, nw_ptr, nb_ptr, y_ptr, ro_ptr, M, H, eps, stride_r, stride_y, stride_ro,
                    pid, nprog, HAS_DB, RMS, RES_OUT, SPLITS, BLOCK_H)


class FfnWorkspace:
    """Scratch for persistent_ffn: h (x's dtype), the fp32 partials and the three barrier counters
    (zero between launches). Calls in stream order may share one; concurrent calls (two streams) may not."""

    def __init__(self, tokens: int, hidden: int, inter: int, splits: int, dtype: torch.dtype,
                 device: torch.device | str):
        self.h = torch.empty(tokens * inter, dtype=dtype, device=device)
        self.parts = torch.empty(splits * tokens * hidden, dtype=torch.float32, device=device)
        self.counters = torch.zeros(3, dtype=torch.int32, device=device)


def _cost_min(cands, cost):
    return min(cands, key=cost) if cands else None


def default_config(m: int, hidden: int, inter: int, act: str, sms: int) -> dict:
    """Tile sizes for M <= 256: the (BM, BN) tiles of each GEMM phase that least load the busiest
    program (its tiles' x / h rows and weight rows, per round of tiles over the grid; for split-K also
    its fp32 partial tile and its share of the row sums). Keys: bm1 bn1 bk1 bm2 bn2 bk2 splits warps
    stages prefetch (bits: 1 up, 2 down weights into L2 first) coop (cooperative launch) grid (0: fit)."""
    gates = 2 if act == "swiglu" else 1
    bm = min(128, max(16, triton.next_power_of_2(max(m, 1))))
    bms = sorted({bm, max(16, bm // 2)}, reverse=True)

    def rounds(tiles):
        return -(-tiles // sms)
    c1 = _cost_min([(b, n) for b in bms for n in (128, 64, 32, 16) if inter % n == 0],
                   lambda c: (rounds(-(-m // c[0]) * inter // c[1]) * (c[0] + gates * c[1]), -c[1]))
    c2 = _cost_min([(b, n, s, k) for b in bms for n in (128, 64, 32, 16) for s in (1, 2, 4, 8, 16)
                    for k in (64, 32, 16) if hidden % n == 0 and inter % (s * k) == 0 and b * n <= 8192],
                   lambda c: (rounds(-(-m // c[0]) * hidden // c[1] * c[2]) * ((c[0] + c[1]) * inter // c[2] * 2 + c[0] * c[1] * 4)
                              + -(-m // sms) * c[2] * hidden * 4, c[2], -c[1], -c[3]))
    if c1 is None or c2 is None:
        raise ValueError(f"no tile fits hidden={hidden}, intermediate={inter} (multiples of 16 needed)")
    bk1 = 64 if hidden % 64 == 0 else 32 if hidden % 32 == 0 else 16
    return dict(bm1=c1[0], bn1=c1[1], bk1=bk1, bm2=c2[0], bn2=c2[1], bk2=c2[3], splits=c2[2],
                warps=8 if c1[0] * c1[1] * gates > 8192 else 4, stages=3, prefetch=3, coop=False, grid=0)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def num_sms(device: torch.device) -> int:
    """The device's SM count (CUDA), 4 elsewhere (the interpreter: a few programs, to stride over tiles)."""
    if device.type != "cuda":
        return 4
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def persistent_ffn(x, up_w, up_b, down_w, down_b, residual, norm_w, norm_b, eps: float, act: str, norm_kind: str,
                   *, phased: bool = False, workspace: FfnWorkspace | None = None, config: dict | None = None,
                   sms: int | None = None, residual_out: torch.Tensor | None = None) -> torch.Tensor:
    """norm(residual + down(act(up(x)))) [M, H] in x's dtype; see the module docstring. `config`
    overrides default_config's keys; `sms` the SM count the grid is bounded by."""
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16) or x.stride(-1) != 1:
        raise ValueError(f"x must be [M, H] fp16 / bf16 with contiguous rows, got {tuple(x.shape)} {x.dtype}")
    m, hidden = x.shape
    if act not in ACTS or norm_kind not in ("layer", "rms"):
        raise ValueError(f"act {act!r} (one of {sorted(ACTS)}) / norm_kind {norm_kind!r} ('layer' or 'rms')")
    gates = 2 if act == "swiglu" else 1
    inter = down_w.shape[-1]
    want = {"up_w": (up_w, (gates * inter, hidden)), "down_w": (down_w, (hidden, inter)),
            "residual": (residual, (m, hidden)), "norm_w": (norm_w, (hidden,)),
            "up_b": (up_b, (gates * inter,)), "down_b": (down_b, (hidden,)), "residual_out": (residual_out, (m, hidden))}
    if norm_kind == "layer":
        want["norm_b"] = (norm_b, (hidden,))
    for name, (t, shape) in want.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} for x {list(x.shape)} and down_w's {inter} columns, got {list(t.shape)}")
    if norm_kind == "layer" and norm_b is None:
        raise ValueError("LayerNorm needs norm_b")
    if not (up_w.is_contiguous() and down_w.is_contiguous() and residual.stride(-1) == 1):
        raise ValueError("up_w and down_w must be contiguous, residual's rows contiguous")
    if m > MAX_TOKENS:
        raise ValueError(f"persistent_ffn is for at most {MAX_TOKENS} tokens, got M={m}")
    y = torch.empty((m, hidden), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    sms = sms or num_sms(x.device)
    cfg = {**default_config(m, hidden, inter, act, sms), **(config or {})}
    s = cfg["splits"]
    tiles = [cfg[k] for k in ("bm1", "bn1", "bk1", "bm2", "bn2", "bk2")]
    if any(t < 16 or t & (t - 1) for t in tiles):
        raise ValueError(f"tile sizes must be powers of 2, at least 16: {tiles}")
    if hidden % cfg["bk1"] or hidden % cfg["bn2"] or inter % cfg["bn1"] or inter % (s * cfg["bk2"]):
        raise ValueError(f"hidden={hidden} must be a multiple of BK1={cfg['bk1']} and BN2={cfg['bn2']}, intermediate="
                         f"{inter} of BN1={cfg['bn1']} and splits x BK2={s} x {cfg['bk2']}")
    tiles = max(-(-m // cfg["bm1"]) * inter // cfg["bn1"], -(-m // cfg["bm2"]) * hidden // cfg["bn2"] * s)
    grid = min(sms, cfg["grid"] or tiles)
    if not phased and _interpreting() and grid > 1:
        raise ValueError("the interpreter runs programs one after another: a grid barrier would wait forever "
                         "(phased=True, or sms=1)")
    ws = workspace or FfnWorkspace(m, hidden, inter, s, x.dtype, x.device)
    if ws.h.numel() < m * inter or ws.parts.numel() < s * m * hidden or ws.h.dtype != x.dtype:
        raise ValueError(f"workspace too small or of another dtype for M={m}, I={inter}, H={hidden}, splits={s}")
    on = small_gemm.use_pdl(x, m)
    prefetch = cfg["prefetch"] if x.is_cuda and not _interpreting() and min(hidden, inter // s) >= 64 else 0
    opts = {**small_gemm.launch_options(on), **({"launch_cooperative_grid": True} if cfg["coop"] else {})}
    for phase in ((1, 2, 3) if phased else (0,)):
        _ffn_kernel[(grid,)](
            x, up_w, up_b if up_b is not None else up_w, down_w, down_b if down_b is not None else down_w, residual,
            norm_w, norm_b if norm_b is not None else norm_w, y, residual_out if residual_out is not None else y,
            ws.h, ws.parts, ws.counters, m, hidden, inter, eps, x.stride(0), residual.stride(0), y.stride(0),
            residual_out.stride(0) if residual_out is not None else 0,
            ACT=ACTS[act], HAS_UB=up_b is not None, HAS_DB=down_b is not None, RMS=norm_kind == "rms",
            RES_OUT=residual_out is not None, PHASE=phase, SPLITS=s, PREFETCH=prefetch,
            LINES_UP=small_gemm._lines(hidden), LINES_DOWN=small_gemm._lines(inter // s), BM1=cfg["bm1"],
            BN1=cfg["bn1"], BK1=cfg["bk1"], BM2=cfg["bm2"], BN2=cfg["bn2"], BK2=cfg["bk2"],
            BLOCK_H=triton.next_power_of_2(hidden), num_warps=cfg["warps"], num_stages=cfg["stages"], **opts)
    return y


def finished_within(seconds: float) -> bool:
    """Whether the current stream's work finishes within `seconds` (False: a launch still runs; a grid
    barrier whose programs are not all resident waits forever, and so would a synchronize)."""
    done = torch.cuda.Event()
    done.record()
    end = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > end:
            return False
        time.sleep(1e-3)
    return True
