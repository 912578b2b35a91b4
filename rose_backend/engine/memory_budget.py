"""What an engine will hold in its device's memory, computed before anything is loaded.

    budget = engine_budget(cfg, "cuda:0", EngineOptions(max_tokens=BATCH_TOKENS, max_seqs=BATCH_SEQS,
                                                       graph_memory_cap_bytes=4 << 30))
    budget.total, budget.describe()    # "weights 1085 MiB, graphs 4096 MiB, ... = 6157 MiB"
    check_fits(budget, device_limit("cuda:0"))   # MemoryBudgetExceeded naming every part

The parts (bytes; b = bytes per element of the engine's dtype):
    weights      the encoder's tensors as the safetensors headers list them, each numel x b (the
                 engine casts every parameter to its dtype), less what the loader leaves out (LM
                 head, pooler, classifier, position ids, BERT's token-type table, folded into the
                 positions) and with the position table as the engine holds it (max_positions rows
                 per token type); plus Qwen3's RoPE table (float32, positions x head_dim), BGE-M3's
                 sparse / ColBERT heads, rerankers' score heads and the sentence-transformers chain's
                 Dense modules (float32, as their model.safetensors headers list them).
    graphs       the cap on the CUDA-graph pool (`graph_memory_cap_bytes`; graph_cache.py); graphs
                 on and no cap: one graph of the largest batch (its activations); graphs off: 0.
    workspace    the attention backends' own device buffers (flashinfer: float + int workspace,
                 $ROSE_FLASHINFER_WORKSPACE_MB), for each backend the engine can choose.
    buffers      the static input buffer (3 x Tb + 2 x Sb + 3 int32 words); on the CPU also the
                 ring of max_inflight + 1 staging and output slots (on a GPU those are pinned host
                 memory, not the device's).
    activations  one eager forward pass of the largest batch: Tb = the largest token bucket
                 (max_tokens padded), L = the longest sequence (min(Tb, max_positions)):
                     Tb x per_token + scores(L) + Tb x 16 (ids, positions, sequence ids)
                 per_token = the most bytes alive per token at any point of the torch path of the
                 model's forward (models/*.py; what is alive at once: the caller's residual
                 stream, the layer's outputs held by locals, the one being made):
                     BERT   max(8H, 6H + 2F, 9H + F) x b     x_in, qkv [3H], attention out, o_proj,
                            add, norm (8H); x_in, qkv, attention, x1, up and GELU [F] each (6H + 2F);
                            then GELU [F] held through down, add, norm (9H + F)
                     Qwen3  max(4H + 4F, 6H + 3Q + 3K + 2Q', 4H + 3 x 4H / b) x b
                            x, residual twice, gate_up [2F], SiLU [F], product [F] (4H + 4F);
                            x, residual twice, qkv [Q + 2K], normed and rotated q, k [Q + K],
                            attention out [Q], o_proj [H], one H more for RoPE's temporaries
                            (Q' = Q when grouped-query attention expands k, v to every head, as
                            torch varlen and the CPU loop do);
                            a norm's float32 copies (3 x 4H bytes)
                     outputs  H x b + 8H + 8Dc  hidden states, their float32 copy, ColBERT's
                            projection and its normalized rows (BGE-M3 heads, Dc wide), `hidden`
                 scores(L) = 3 x heads x L^2 x 4 on the CPU (the loop's SDPA runs the math kernel:
                 scores, softmax and a masked copy of [heads, L, L] float32), 0 on a GPU (flash
                 kernels hold O(L) state). The fused CUDA kernels (in-place norms, GELU epilogue)
                 allocate a subset of the torch path, so the estimate is an upper bound there too;
                 a forward captured in a graph allocates in the graph pool instead (graphs).
H hidden size, F intermediate size, Q = heads x head_dim, K = kv heads x head_dim.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.backend_table import BackendTable
from rose_backend.engine.graph_cache import seq_buckets, token_buckets
from rose_backend.engine.options import EngineOptions
from rose_backend.engine.staging import Layout
from rose_backend.layers.attention import available_backends, backend_class
from rose_backend.layers.fp8 import fp8_copy_bytes
from rose_backend.loading import HEAD_FILES
from rose_backend.models.m3_heads import head_files
from rose_backend.models.registry import attention_shape

MIB = 1 << 20
GPU_MARGIN_BYTES = 1 << 30       # left free on a GPU: CUDA context growth, cuBLAS and kernel modules


class MemoryBudgetExceeded(ValueError):
    """The budget of an engine is larger than the memory it may use."""


@dataclass(frozen=True)
class MemoryBudget:
    weights: int
    graphs: int
    workspace: int
    buffers: int
    activations: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def parts_mib(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) / MIB for f in fields(self)}

    def describe(self) -> str:
        parts = ", ".join(f"{n} {v:.0f} MiB" for n, v in self.parts_mib().items())
        return f"{parts} = {self.total / MIB:.0f} MiB"

    def __add__(self, other: MemoryBudget) -> MemoryBudget:
        """Two engines' budgets part by part (the query lane's engine beside the main one)."""
        return MemoryBudget(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def engine_budget(cfg: ModelConfig, device: str | torch.device, options: EngineOptions | None = None,
                  shared_weights: bool = False) -> MemoryBudget:
    """The budget of Engine(cfg, device, options): with options.fp8_min_tokens the engine also holds
    FP8 copies of the projections (layers/fp8.py); shared_weights: it runs another engine's weights
    (Engine(weights_from=...)), so they are not counted again."""
    o = options or EngineOptions()
    device = torch.device(device)
    cuda = device.type == "cuda"
    dtype, graphs, (max_tokens, max_seqs) = o.torch_dtype(device), o.graphs_on(device), o.buckets(cfg.max_positions)
    elt = torch.empty(0, dtype=dtype).element_size()
    tb, sb = token_buckets(max_tokens)[-1], seq_buckets(max_seqs)[-1]
    act = activation_bytes(cfg, elt, tb, min(tb, cfg.max_positions), cpu_scores=not cuda)
    words = Layout(sb, tb).words * 4
    ring = 0 if cuda else (o.max_inflight + 1) * (words + (sb + 1) * cfg.embedding_dim * 4)
    pool = 0 if not graphs else (act if o.graph_memory_cap_bytes is None else o.graph_memory_cap_bytes)
    weights = 0 if shared_weights else weight_bytes(cfg, elt) + (fp8_copy_bytes(cfg) if o.fp8_min_tokens else 0)
    return MemoryBudget(weights=weights, graphs=pool,
                        workspace=workspace_bytes(cfg, device, dtype, o.attention), buffers=words + ring,
                        activations=act)


def activation_bytes(cfg: ModelConfig, elt: int, tokens: int, longest: int, cpu_scores: bool = True) -> int:
    """Upper bound of the bytes one eager forward pass of `tokens` tokens allocates (module docstring)."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    q, k = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if cfg.is_decoder:
        expand = q if cfg.num_kv_heads < cfg.num_heads else 0
        per = max((4 * h + 4 * f) * elt, (6 * h + 3 * q + 3 * k + 2 * expand) * elt, 4 * h * elt + 12 * h)
    else:
        per = max(8 * h, 6 * h + 2 * f, 9 * h + f) * elt
    heads = head_files(cfg.model_dir)
    dc = _head_rows(heads["colbert_linear"]) if "colbert_linear" in heads else 0
    per = max(per, h * elt + 8 * h + 8 * dc)
    scores = 3 * cfg.num_heads * longest * longest * 4 if cpu_scores else 0
    return tokens * (per + 16) + scores


def weight_bytes(cfg: ModelConfig, elt: int) -> int:
    """Bytes of the weights the engine will hold (module docstring), from the files' headers."""
    decoder = cfg.is_decoder
    prefixes = ("model.",) if decoder else ("bert.", "roberta.", "distilbert.", "mpnet.", "model.", "0.auto_model.")
    skipped = ("lm_head.",) if decoder else ("pooler.", "lm_head", "cls.", "classifier.", "pre_classifier.", "head.",
                                             "decoder.", "vocab_")
    total = 0
    for path in sorted(Path(cfg.model_dir).glob("*.safetensors")):
        if path.stem in HEAD_FILES:
            continue
        for name, shape in safetensors_shapes(path).items():
            name = next((name[len(p):] for p in prefixes if name.startswith(p)), name)
            if name.startswith(skipped) or name.endswith("position_ids") \
                    or name == "embeddings.token_type_embeddings.weight":
                continue
            if name == "embeddings.position_embeddings.weight":      # one block of rows per token type
                shape = [cfg.max_positions * (cfg.type_vocab_size if cfg.uses_token_types else 1), shape[1]]
            total += _numel(shape) * elt
    if decoder:                                                      # RoPE table, float32
        total += max(cfg.max_position_embeddings, cfg.max_seq_length) * cfg.head_dim * 4
    h = cfg.hidden_size
    if cfg.kind == "cross-encoder":
        total += (h * h + 2 * h + 1) * 4
    elif cfg.kind == "qwen3-reranker":
        total += 2 * h * 4
    for path in head_files(cfg.model_dir).values():                 # BGE-M3 heads, float32
        total += (_head_rows(path) * (h + 1)) * 4
    for dense in cfg.chain.dense if cfg.chain is not None and not cfg.is_reranker else ():   # float32
        total += sum(_numel(s) for s in safetensors_shapes(dense.folder / "model.safetensors").values()) * 4
    return total


def workspace_bytes(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, attention: str | None) -> int:
    """Device buffers of the attention backends the engine can run: the named one, or (auto) each
    that the measured table picks for some configuration here (Engine.backend_for)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    shape = attention_shape(cfg, dtype)
    if attention not in (None, "auto"):
        names = {attention}
    else:
        avail = available_backends(shape, device)
        avail = [n for n in avail if backend_class(n).supports_cuda_graphs] or avail
        table = BackendTable.load()
        cells = table.shapes.get(shape.key, []) or [{"seqs": 1, "tokens": 128}]
        names = {table.choose(shape.key, c["seqs"], c["tokens"], avail, cfg.num_layers,
                              {n: backend_class(n).host_plan_us for n in avail}) for c in cells} if avail else set()
    return sum(getattr(backend_class(n), "float_workspace_bytes", 0)               # an int workspace per window
               + getattr(backend_class(n), "int_workspace_bytes", 0) * len(shape.windows) for n in names)


def device_limit(device: str | torch.device, limit_bytes: int | None = None) -> int | None:
    """The bytes an engine on `device` may hold: `limit_bytes` when given; else on a GPU its free
    memory less GPU_MARGIN_BYTES, on the CPU None (no check)."""
    if limit_bytes is not None:
        return limit_bytes
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, free - GPU_MARGIN_BYTES)


def check_fits(budget: MemoryBudget, limit: int | None, where: str = "") -> None:
    """MemoryBudgetExceeded naming every part in MiB and the limit when the budget is over it."""
    if limit is not None and budget.total > limit:
        raise MemoryBudgetExceeded(
            f"the memory budget does not fit{' ' + where if where else ''}: {budget.describe()}, "
            f"over the limit of {limit / MIB:.0f} MiB; lower max_batch_tokens or graph_memory_mb, "
            f"or raise memory_limit_mb")


def safetensors_shapes(path: str | Path) -> dict[str, list[int]]:
    """{tensor name: shape} from a .safetensors file's JSON header (no tensor data read)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def _head_rows(path: Path) -> int:
    """Output rows of a BGE-M3 head file's weight (1 for sparse, Dc for ColBERT)."""
    if path.suffix == ".safetensors":
        return int(safetensors_shapes(path)["weight"][0])
    state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    return int(state["weight"].shape[0])


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n

