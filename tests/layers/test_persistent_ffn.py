"""The persistent FFN kernel (layers/persistent_ffn.py) against float32 torch, run by Triton's
interpreter on the CPU in float16 (its bfloat16 is not numpy's): phased (three launches) for both
flavours (bias + exact GELU + LayerNorm; SwiGLU + RMSNorm, no biases), with a few programs striding
over tiles; the persistent form's barriers with one program (the interpreter runs programs one
after another); and the refusals. The GPU suite runs it compiled, many programs at a barrier, in
CUDA graphs (tests/gpu/test_persistent_ffn_gpu.py)."""
import os

import pytest
import torch
import torch.nn.functional as F

if torch.cuda.is_available():     # the interpreter would also take over the GPU tests of this process
    pytest.skip("run compiled by the GPU suite on CUDA hosts", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from rose_backend.layers import persistent_ffn as pf  # noqa: E402

H = 64
FLAVOURS = {"gelu-layer": dict(inter=128, act="gelu", norm="layer", bias=True),
            "swiglu-rms": dict(inter=192, act="swiglu", norm="rms", bias=False)}


def _block(flavour, m, seed=0):
    f = FLAVOURS[flavour]
    g = torch.Generator().manual_seed(seed + m)
    i, gates = f["inter"], 2 if f["act"] == "swiglu" else 1

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).half()
    return dict(x=rand(m, H), up_w=rand(gates * i, H, scale=H ** -0.5), up_b=rand(gates * i) if f["bias"] else None,
                down_w=rand(H, i, scale=i ** -0.5), down_b=rand(H) if f["bias"] else None, residual=rand(m, H),
                norm_w=(1 + 0.1 * torch.randn(H, generator=g)).half(),
                norm_b=rand(H, scale=0.1) if f["norm"] == "layer" else None,
                eps=1e-5 if f["norm"] == "layer" else 1e-6, act=f["act"], norm_kind=f["norm"])


def _want(b):
    """float32 reference from the same fp16 inputs: (y, residual + FFN)."""
    up = b["x"].float() @ b["up_w"].float().t() + (b["up_b"].float() if b["up_b"] is not None else 0)
    if b["act"] == "swiglu":
        gate, u = up.chunk(2, dim=-1)
        h = F.silu(gate) * u
    else:
        h = F.gelu(up)
    total = h @ b["down_w"].float().t() + b["residual"].float() + (b["down_b"].float() if b["down_b"] is not None else 0)
    if b["norm_kind"] == "rms":
        return total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + b["eps"]) * b["norm_w"].float(), total
    return F.layer_norm(total, (H,), b["norm_w"].float(), b["norm_b"].float(), b["eps"]), total


def _run(b, **kw):
    return pf.persistent_ffn(b["x"], b["up_w"], b["up_b"], b["down_w"], b["down_b"], b["residual"], b["norm_w"],
                             b["norm_b"], b["eps"], b["act"], b["norm_kind"], **kw)


@pytest.mark.parametrize("m", [1, 7, 32])
@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_phased_matches_float32(flavour, m):
    b = _block(flavour, m)
    want, _ = _want(b)
    got = _run(b, phased=True)
    assert got.dtype == torch.float16 and got.shape == (m, H)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)      # h and y rounded to fp16


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_small_tiles_many_per_program_and_the_sum_out(flavour):
    """16-wide tiles, 4 splits, 3 programs: each program walks several tiles of every phase and rows of
    the norm; residual_out receives the unrounded residual + FFN."""
    b = _block(flavour, 37, seed=1)
    want, total = _want(b)
    cfg = dict(bm1=16, bn1=16, bk1=32, bm2=16, bn2=16, bk2=16, splits=4)
    out = torch.empty_like(b["residual"])
    got = _run(b, phased=True, config=cfg, sms=3, residual_out=out)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), total, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_persistent_form_with_one_program_equals_phased_and_resets_its_counters(flavour):
    b = _block(flavour, 20, seed=2)
    ws = pf.FfnWorkspace(32, H, FLAVOURS[flavour]["inter"], 16, torch.float16, "cpu")
    phased = _run(b, phased=True, workspace=ws, sms=1)
    for _ in range(2):                              # the counters are zero again after each launch
        assert torch.equal(_run(b, workspace=ws, sms=1), phased)
        assert ws.counters.tolist() == [0, 0, 0]


def test_default_config_fills_the_grid_at_the_served_shapes():
    for inter, act in ((4096, "gelu"), (3072, "swiglu")):
        for m in (1, 32, 128, 256):
            c = pf.default_config(m, 1024, inter, act, 132)
            up = -(-m // c["bm1"]) * inter // c["bn1"]
            down = -(-m // c["bm2"]) * 1024 // c["bn2"] * c["splits"]
            assert 64 <= max(up, down) <= 2 * 132, (inter, m, c)
            assert 1024 % c["bk1"] == 0 and inter % (c["splits"] * c["bk2"]) == 0


def test_refuses_bad_shapes_with_a_clear_error():
    b = _block("gelu-layer", 4)
    with pytest.raises(ValueError, match=r"down_w must be \[64, 128\]"):
        _run({**b, "down_w": b["down_w"][:32].contiguous()})
    with pytest.raises(ValueError, match="up_w must be"):
        _run({**b, "act": "swiglu"})                              # SwiGLU needs gate and up rows [2I, H]
    with pytest.raises(ValueError, match="intermediate=128 of BN1=256"):
        _run(b, phased=True, config={"bn1": 256})
    with pytest.raises(ValueError, match="powers of 2"):
        _run(b, phased=True, config={"bn1": 48})
    with pytest.raises(ValueError, match="at most 256 tokens"):
        _run(_block("gelu-layer", 257), phased=True)
    with pytest.raises(ValueError, match="wait forever"):
        _run(b, sms=4)                                            # persistent, several programs, interpreter
    with pytest.raises(ValueError, match="LayerNorm needs norm_b"):
        _run({**b, "norm_b": None})
    with pytest.raises(ValueError, match="workspace too small"):
        _run(b, phased=True, workspace=pf.FfnWorkspace(2, H, 128, 8, torch.float16, "cpu"))
