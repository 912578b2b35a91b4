"""The persistent FFN kernel (layers/persistent_ffn.py) compiled, at the served shapes: BGE-M3 (H 1024,
I 4096, biases, exact GELU, LayerNorm) and pplx-embed (I 3072, SwiGLU, RMSNorm, no biases). The
one-launch form (grid barriers across all programs) against float32 and bit-equal to the phased form
(same tiles, three launches), with the scratch filled with NaN first so that a read before the
barrier shows; 50 replays of a CUDA graph with fixed arguments, each the same (the barrier counters
come back to zero); blocks of both shapes and two grid sizes back to back in one graph; with and
without programmatic dependent launch; a cooperative launch. A launch whose barrier never opens
would hang the GPU: the tests wait for it at most 60 s, then end the process."""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

H = 1024
FLAVOURS = {"bge-m3": dict(inter=4096, act="gelu", norm="layer", bias=True),
            "pplx-embed": dict(inter=3072, act="swiglu", norm="rms", bias=False)}


def _pf():
    # imported in the tests, not at collection: the CPU suite switches triton to its interpreter
    from rose_backend.layers import persistent_ffn
    return persistent_ffn


@pytest.fixture(params=[0, 4096], ids=["plain", "pdl"])
def pdl(request, monkeypatch):
    from rose_backend.layers import small_gemm
    monkeypatch.setattr(small_gemm, "pdl", request.param)
    return request.param


def _block(flavour, m, seed=0):
    f = FLAVOURS[flavour]
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + m)
    i, gates = f["inter"], 2 if f["act"] == "swiglu" else 1

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()
    return dict(x=rand(m, H), up_w=rand(gates * i, H, scale=H ** -0.5),
                up_b=rand(gates * i) if f["bias"] else None, down_w=rand(H, i, scale=i ** -0.5),
                down_b=rand(H) if f["bias"] else None, residual=rand(m, H),
                norm_w=(1 + 0.1 * torch.randn(H, device="cuda", generator=g)).bfloat16(),
                norm_b=rand(H, scale=0.1) if f["norm"] == "layer" else None,
                eps=1e-5 if f["norm"] == "layer" else 1e-6, act=f["act"], norm_kind=f["norm"])


def _want(b):
    up = b["x"].float() @ b["up_w"].float().t() + (b["up_b"].float() if b["up_b"] is not None else 0)
    if b["act"] == "swiglu":
        gate, u = up.chunk(2, dim=-1)
        h = F.silu(gate) * u
    else:
        h = F.gelu(up)
    total = h @ b["down_w"].float().t() + b["residual"].float() + (b["down_b"].float() if b["down_b"] is not None else 0)
    if b["norm_kind"] == "rms":
        return total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + b["eps"]) * b["norm_w"].float()
    return F.layer_norm(total, (H,), b["norm_w"].float(), b["norm_b"].float(), b["eps"])


def _run(b, **kw):
    return _pf().persistent_ffn(b["x"], b["up_w"], b["up_b"], b["down_w"], b["down_b"], b["residual"], b["norm_w"],
                                b["norm_b"], b["eps"], b["act"], b["norm_kind"], **kw)


def _workspace(m=256):
    return _pf().FfnWorkspace(m, H, 4096, 16, torch.bfloat16, "cuda")


def _poison(ws):
    ws.h.fill_(float("nan"))
    ws.parts.fill_(float("nan"))


def _finish(what: str, seconds: float = 60.0) -> None:
    """Wait for the stream; a grid barrier that never opens cannot be interrupted: end the process."""
    if not _pf().finished_within(seconds):
        sys.stderr.write(f"\n{what}: not finished after {seconds:.0f} s; the grid barrier waits forever "
                         "(programs not all resident?). Ending the process.\n")
        sys.stderr.flush()
        os._exit(3)


@pytest.mark.parametrize("m", [1, 16, 128, 256])
@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_persistent_matches_float32_and_equals_phased(flavour, m, pdl):
    b = _block(flavour, m)
    ws = _workspace()
    _poison(ws)
    got = _run(b, workspace=ws)
    _finish(f"persistent_ffn {flavour} M={m}")
    assert ws.counters.tolist() == [0, 0, 0]
    want = _want(b)
    err = float((got.float() - want).abs().max())
    assert err < 5e-2, err                                        # h and y rounded to bf16
    _poison(ws)
    phased = _run(b, workspace=ws, phased=True)
    torch.cuda.synchronize()
    assert torch.equal(got, phased), float((got.float() - phased.float()).abs().max())


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_graph_replays_with_fixed_arguments_give_the_same_result(flavour, pdl):
    b = _block(flavour, 128, seed=1)
    ws = _workspace()
    want = _run(b, workspace=ws)                                  # compiles outside the capture
    _finish("eager launch")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(b, workspace=ws)
    for i in range(50):
        out.zero_()
        graph.replay()
        _finish(f"replay {i}")
        assert torch.equal(out, want), i
    assert ws.counters.tolist() == [0, 0, 0]
    assert float((want.float() - _want(b)).abs().max()) < 5e-2


def test_blocks_of_both_shapes_back_to_back_in_one_graph(pdl):
    """BGE-M3 block -> pplx-embed block on its output with a smaller grid -> BGE-M3 block, one workspace
    (and one set of counters) for all: each launch finds the counters the one before left at zero."""
    ws = _workspace()
    a, q, c = _block("bge-m3", 128, seed=2), _block("pplx-embed", 128, seed=3), _block("bge-m3", 128, seed=4)

    def chain():
        y = _run(a, workspace=ws)
        y = _run({**q, "x": y, "residual": y}, workspace=ws, config={"grid": 100})
        return _run({**c, "x": y, "residual": y}, workspace=ws)
    want = chain()
    _finish("eager chain")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for i in range(20):
        out.zero_()
        graph.replay()
        _finish(f"replay {i}")
        assert torch.equal(out, want), i
    assert ws.counters.tolist() == [0, 0, 0]
    y = _want(a).bfloat16()                                       # the float32 chain, rounded between blocks
    y = _want({**q, "x": y, "residual": y}).bfloat16()
    assert float((want.float() - _want({**c, "x": y, "residual": y})).abs().max()) < 1e-1


def test_cooperative_launch_equals_the_plain_one(pdl):
    """CU_LAUNCH_ATTRIBUTE_COOPERATIVE (the driver refuses a grid that cannot be co-resident instead of
    letting it wait forever), eager and in a graph; with PDL too (both launch attributes at once)."""
    b = _block("bge-m3", 128, seed=5)
    ws = _workspace()
    want = _run(b, workspace=ws)
    got = _run(b, workspace=ws, config={"coop": True})
    _finish("cooperative launch")
    assert torch.equal(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(b, workspace=ws, config={"coop": True})
    for i in range(5):
        out.zero_()
        graph.replay()
        _finish(f"cooperative replay {i}")
        assert torch.equal(out, want), i
