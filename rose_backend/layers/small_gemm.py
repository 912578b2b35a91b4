"""The projections at small token counts, in OpenAI's triton language (CUDA only; the interpreter runs
it on the CPU for the tests).

One kernel, two uses:

    y = gemm_act(x, w, bias, act)          # act(x @ w.T + bias) [M, N]: "none" | "gelu" | "gelu_tanh" | "swiglu"
    parts = splitk_matmul(x, w, splits)    # x @ w.T as `splits` fp32 partial products [splits, M, N]

"swiglu" reads w's rows as gate then up and writes silu(gate) * up [M, N / 2]; "gelu" is the exact
(erf) form. The split-K form feeds the add + norm after `o` and `down` (layers/projection.py), which
sums the partials. At 128-256 tokens these GEMMs read a few MB of weights each, a few microseconds of
work, so the time between kernels matters as much as the kernels: with `pdl` a kernel is launched with
programmatic dependent launch, starts while the kernel before it still runs, pulls its slice of the
weights into L2 (weights do not depend on that kernel), then waits for its input (griddepcontrol.wait)
and lets the kernel after it start. Every kernel launched so waits before it ends, so completion
stays in stream order. The norms of layers/fused_kernels.py take part the same way.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rose_backend import env_vars

# the largest token count whose kernels launch with PDL (0: none; Triton's interpreter has no PDL); read
# at each launch / capture
pdl = 0 if env_vars.TRITON_INTERPRET.flag() else 128
_HOPPER: dict[int, bool] = {}
ACTS = {"none": 0, "gelu": 1, "swiglu": 2, "gelu_tanh": 3}


@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL: wait for the kernel before (its writes visible), then let the next kernel start."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _prefetch_rows(w_ptr, rows, stride_w, k0, k_span, LINES: tl.constexpr):
    """Pull rows x [k0, k0 + k_span) of w (bf16 / fp16) into L2, one prefetch per 128-byte line."""
    col = tl.minimum(tl.arange(0, LINES) * 64, k_span - 64)
    _prefetch_l2(w_ptr + rows[:, None].to(tl.int64) * stride_w + (k0 + col)[None, :])


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_xm, stride_wn, stride_ym, k_per_split, up_off,
                 ACT: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIALS: tl.constexpr, PDL: tl.constexpr,
                 LINES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n, pid_m, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k0 = pid_s * k_per_split
    n_ok = rn < N
    rn_w = tl.where(n_ok, rn, 0)
    if LINES > 0:             # with PDL: the weights while the kernel before still runs
        _prefetch_rows(w_ptr, rn_w, stride_wn, k0, k_per_split, LINES)
        if ACT == 2:
            _prefetch_rows(w_ptr, rn_w + up_off, stride_wn, k0, k_per_split, LINES)
    pdl_wait(PDL)
    m_ok = rm[:, None] < M
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k0 + rk)[None, :]
    w_ptrs = w_ptr + rn_w[None, :].to(tl.int64) * stride_wn + (k0 + rk)[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, k_per_split, BK):
        a = tl.load(x_ptrs, mask=m_ok, other=0.0)
        acc = tl.dot(a, tl.load(w_ptrs), acc)
        if ACT == 2:
            up = tl.dot(a, tl.load(w_ptrs + up_off * stride_wn), up)
        x_ptrs += BK
        w_ptrs += BK
    ok = m_ok & n_ok[None, :]
    if PARTIALS:
        out = y_ptr + pid_s.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(out, acc, mask=ok)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn_w).to(tl.float32)[None, :]
            if ACT == 2:
                up += tl.load(b_ptr + rn_w + up_off).to(tl.float32)[None, :]
        if ACT == 1:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        if ACT == 2:
            acc = acc / (1.0 + tl.exp(-acc)) * up
        if ACT == 3:          # tanh(u) = 2 sigmoid(2u) - 1
            u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
            acc = 0.5 * acc * (2.0 / (1.0 + tl.exp(-2.0 * u)))
        out = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok)


def _lines(k_span: int) -> int:
    return triton.next_power_of_2(max(1, k_span // 64))


def _config(m: int, n: int) -> tuple[int, int, int, int]:
    """(BM, BN, BK, warps): one tile for every shape (with 5 stages), the fastest at 128 tokens for
    the four projection shapes of BGE-M3 and Qwen3-0.6B on Hopper."""
    return 64, 64, 64, 4


def gemm_act(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act: str = "none",
             config: tuple[int, int, int, int] | None = None, stages: int = 5) -> torch.Tensor:
    """act(x @ w.T + bias) for x [M, K], w [N, K] (rows contiguous) -> [M, N] ([M, N / 2] for swiglu)."""
    m, k = x.shape
    n = w.shape[0] // 2 if act == "swiglu" else w.shape[0]
    assert w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1 and w.shape[0] % (2 if act == "swiglu" else 1) == 0
    bm, bn, bk, warps = config or _config(m, n)
    if k % bk:
        raise ValueError(f"K={k} is not a multiple of BK={bk}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    on = use_pdl(x, m)
    if m:
        _gemm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), 1)](
            x, w, bias if bias is not None else w, y, m, n, x.stride(0), w.stride(0), y.stride(0), k, n,
            ACT=ACTS[act], HAS_BIAS=bias is not None, PARTIALS=False, LINES=_lines(k) if on else 0,
            BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, **launch_options(on))
    return y


def splitk_matmul(x: torch.Tensor, w: torch.Tensor, splits: int, bm: int = 64, bn: int = 64, bk: int = 128,
                  warps: int = 4, stages: int = 3, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K].T as `splits` fp32 partial products [splits, M, N] (their sum is the result)."""
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    if k % (splits * bk):
        raise ValueError(f"K={k} is not a multiple of splits x BK = {splits} x {bk}")
    if out is None:
        out = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    on = use_pdl(x, m)
    if m:
        _gemm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), splits)](
            x, w, w, out, m, n, x.stride(0), w.stride(0), n, k // splits, 0,
            ACT=0, HAS_BIAS=False, PARTIALS=True, LINES=_lines(k // splits) if on else 0,
            BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, **launch_options(on))
    return out


def use_pdl(t: torch.Tensor, tokens: int) -> bool:
    """Programmatic dependent launch for a kernel over `tokens` tokens on t's device: at most `pdl`
    tokens, and the GPU has it (sm_90+)."""
    if not (0 < tokens <= pdl and t.is_cuda):
        return False
    i = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if i not in _HOPPER:
        _HOPPER[i] = torch.cuda.get_device_capability(i)[0] >= 9
    return _HOPPER[i]


def launch_options(on: bool) -> dict:
    """PDL=on and the launch option that goes with it, for a triton-language kernel launch."""
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}
