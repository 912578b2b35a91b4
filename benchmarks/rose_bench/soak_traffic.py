"""The soak's traffic and probes (rose_bench soak): the reference pool, malformed requests,
and the server's memory as the operating system and nvidia-smi see it."""
from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import numpy as np

from rose_backend.launch.tritonserver import TritonProcess
from rose_backend.launch.supervision import processes_with
from rose_client import StreamConnection

# malformed kind -> what its error must say
BAD_KINDS = {"fp32": "data-type", "2d": "shape", "missing": "SEQ_LENS|expected 2 inputs", "extra": "NORMALIZE",
             "vocab": "vocabulary", "lens": "SEQ_LENS"}


class Pool:
    """Sequences with their reference rows (each embedded alone before the load)."""

    def __init__(self, rng, n: int, max_len: int, vocab: int, random_folder: bool):
        lens = np.unique(np.round(np.exp(rng.uniform(0, np.log(max_len), n))).astype(int).clip(1, max_len))
        lens = np.resize(lens, n)
        self.ids = [rng.integers(1000, vocab - 1, size=int(k), dtype=np.int32) for k in lens]
        # random folders: "w123 w456" is ids [123, 456]; a real tokenizer: words of about one token
        words = "embedding server queue batch token graph kernel latency memory stream".split()
        self.texts = [" ".join(f"w{i}" for i in s) if random_folder else
                      " ".join(words[i % len(words)] for i in s) for s in self.ids]
        self.ref_ids: list[np.ndarray] = []
        self.ref_text: list[np.ndarray] = []

    def fill(self, url: str) -> None:
        conn = StreamConnection(url)
        try:
            for s, t in zip(self.ids, self.texts):
                self.ref_ids.append(conn.infer("rose", ids_inputs([s])).result(600)["EMBEDDINGS"][0])
                self.ref_text.append(conn.infer("embed", [("TEXT", [t])]).result(600)["EMBEDDINGS"][0])
        finally:
            conn.close()


def ids_inputs(seqs):
    return [("INPUT_IDS", np.concatenate(seqs).astype(np.int32)),
            ("SEQ_LENS", np.array([len(s) for s in seqs], np.int32))]


def malformed(kind: str, vocab: int):
    ids, lens = np.array([1000, 1001, 1002], np.int32), np.array([3], np.int32)
    return {"fp32": [("INPUT_IDS", ids.astype(np.float32)), ("SEQ_LENS", lens)],
            "2d": [("INPUT_IDS", ids[None]), ("SEQ_LENS", lens)],
            "missing": [("INPUT_IDS", ids)],
            "extra": [("INPUT_IDS", ids), ("SEQ_LENS", lens), ("NORMALIZE", lens)],
            "vocab": [("INPUT_IDS", np.array([1000, vocab + 5, 1002], np.int32)), ("SEQ_LENS", lens)],
            "lens": [("INPUT_IDS", ids), ("SEQ_LENS", np.array([5], np.int32))]}[kind]


def server_processes(srv: TritonProcess) -> list[int]:
    return [srv.proc.pid] + list(processes_with([srv.shm_prefix]))


def rss_mib(pids) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def gpu_mib(pids) -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    pids = set(pids)
    return float(sum(int(m) for p, m in (line.split(",") for line in out.stdout.strip().splitlines() if line)
                     if int(p) in pids))


def metric(srv: TritonProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports.metrics}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.split()[-1])
    return 0.0
