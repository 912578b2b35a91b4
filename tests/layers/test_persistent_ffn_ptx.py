"""The persistent FFN kernel (layers/persistent_ffn.py) compiled for the H200 (sm_90a) on the CPU
with Triton's own LLVM and ptxas, no GPU: its default tiles at the served shapes fit (shared memory,
no register spills), and the PTX holds the grid barrier as designed: one thread per program does each
counter atomic (acq_rel, gpu scope) and spins on acquire loads; the other programs' h and partials
are read around L1 (.cg, 16-byte copies); the phased kernels have no atomics. Compiled in a child
process: the CPU suite's Triton runs in its interpreter (tests/layers/test_persistent_ffn.py)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:    # not imported here: the CPU suite's modules switch it to its interpreter
    pytest.skip("needs triton", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]
SMEM_LIMIT = 227 * 1024              # per block on sm_90
# (act, norm, tokens, intermediate, PHASE, PDL)
VARIANTS = [("gelu", "layer", 128, 4096, 0, True), ("gelu", "layer", 256, 4096, 0, False),
            ("swiglu", "rms", 128, 3072, 0, True), ("swiglu", "rms", 256, 3072, 0, False),
            ("gelu", "layer", 128, 4096, 2, True)]


def compile_variant(act, norm, m, inter, phase, pdl, hidden=1024, sms=132):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rose_backend.layers import persistent_ffn as pf
    cfg = pf.default_config(m, hidden, inter, act, sms)
    fn = pf._ffn_kernel
    ptrs = ["x_ptr", "wu_ptr", "bu_ptr", "wd_ptr", "bd_ptr", "r_ptr", "nw_ptr", "nb_ptr", "y_ptr", "ro_ptr", "h_ptr"]
    sig = {**{p: "*bf16" for p in ptrs}, "p_ptr": "*fp32", "ctr_ptr": "*i32",
           **{a: "i32" for a in ("M", "H", "I", "stride_x", "stride_r", "stride_y", "stride_ro")}, "eps": "fp32"}
    const = dict(ACT=pf.ACTS[act], HAS_UB=act != "swiglu", HAS_DB=act != "swiglu", RMS=norm == "rms",
                 RES_OUT=norm == "rms", PHASE=phase, SPLITS=cfg["splits"], PREFETCH=cfg["prefetch"],
                 LINES_UP=triton.next_power_of_2(hidden // 64),
                 LINES_DOWN=triton.next_power_of_2(inter // cfg["splits"] // 64), PDL=pdl,
                 BM1=cfg["bm1"], BN1=cfg["bn1"], BK1=cfg["bk1"], BM2=cfg["bm2"], BN2=cfg["bn2"], BK2=cfg["bk2"],
                 BLOCK_H=triton.next_power_of_2(hidden))
    sig.update({k: "constexpr" for k in const})
    aligned = ptrs + ["p_ptr", "ctr_ptr", "H", "I", "stride_x", "stride_r", "stride_y"]      # as the launcher specializes
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 64),
                       options=dict(num_warps=cfg["warps"], num_stages=cfg["stages"]))
    ptx = k.asm["ptx"]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ffn-{os.getpid()}.ptx"
    path.write_text(ptx)
    log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                         capture_output=True, text=True, check=True).stderr
    path.unlink()
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    pred = re.findall(r"(@%p\d+)? atom\.global\.(\S+) ", ptx)
    return {"shared": k.metadata.shared, "spill_bytes": sum(spills), "atoms": [p[1] for p in pred],
            "atoms_predicated": all(p[0] for p in pred), "acquire_loads": len(re.findall(r"ld\.global\.gpu\.acquire", ptx)),
            "ca_copies": len(re.findall(r"cp\.async\.ca", ptx)), "cg_copies": len(re.findall(r"cp\.async\.cg", ptx)),
            "cg_loads": len(re.findall(r"ld\.global\.cg", ptx)), "gdc_wait": "griddepcontrol.wait" in ptx}


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    if p.returncode:
        pytest.fail(p.stdout[-3000:] + p.stderr[-3000:])
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=["-".join(map(str, v)) for v in VARIANTS])
def test_compiles_for_sm90_with_the_barrier_as_designed(compiled, variant):
    act, norm, m, inter, phase, pdl = VARIANTS[variant]
    r = compiled[variant]
    assert r["shared"] <= SMEM_LIMIT and r["spill_bytes"] == 0, r
    assert r["ca_copies"] == 0 and r["cg_copies"] > 0, r           # weights, x, h: 16-byte copies around L1
    assert r["gdc_wait"] == pdl, r
    if phase:
        assert r["atoms"] == [], r
        return
    # barrier 1 and 2 arrivals, the exit count; the three zeroings: each by one thread of its program
    assert sorted(r["atoms"]) == sorted(["gpu.acq_rel.add.u32"] * 3 + ["gpu.acq_rel.exch.b32"] * 3), r
    assert r["atoms_predicated"] and r["acquire_loads"] == 2, r
    assert r["cg_loads"] > 0, r                                    # the partials' row sums


if __name__ == "__main__":
    print(json.dumps([compile_variant(*v) for v in VARIANTS]))
