"""The static input layout of a graph configuration, staged on the host and viewed on the device.

One int32 buffer holds everything a configuration (Sb sequence slots, Tb tokens) reads, so a batch
travels to the device in one copy:

    ids  [Tb]      token ids, padding rows hold the pad id
    pos  [Tb]      position of each token in its sequence (plus token type x stride where used)
    seq  [Tb]      sequence slot of each token; padding rows point at the dummy slot Sb
    cu   [Sb + 2]  cu_seqlens: real sequences, then empty slots, then the dummy holding the padding
    inv  [Sb + 1]  float32 bits: 1 / length for mean pooling (0 for empty slots and the dummy)

`Layout` names these ranges once; the host writer (`stage`) and the device views (`DeviceViews`)
both read them from it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from rose_backend.engine.batch import PackedBatch


@dataclass(frozen=True, slots=True)
class Layout:
    sb: int
    tb: int

    @property
    def ids(self) -> slice:
        return slice(0, self.tb)

    @property
    def pos(self) -> slice:
        return slice(self.tb, 2 * self.tb)

    @property
    def seq(self) -> slice:
        return slice(2 * self.tb, 3 * self.tb)

    @property
    def cu(self) -> slice:
        return slice(3 * self.tb, 3 * self.tb + self.sb + 2)

    @property
    def inv(self) -> slice:
        start = 3 * self.tb + self.sb + 2
        return slice(start, start + self.sb + 1)

    @property
    def words(self) -> int:
        return 3 * self.tb + 2 * self.sb + 3


class Slot:
    """One entry of the ring of pinned host buffers (inputs staged, outputs returned)."""

    def __init__(self, words: int, out_rows: int, dim: int, pinned: bool):
        self.staging = torch.zeros(words, dtype=torch.int32, pin_memory=pinned)    # a Layout's words
        self.np = self.staging.numpy()
        self.out = torch.empty(out_rows, dim, dtype=torch.float32, pin_memory=pinned)
        # recorded after `out` is filled (reused); the forward pass and the staging's host-to-device
        # copy came before it on the stream, so once it has fired the staging may be rewritten too
        self.done = torch.cuda.Event() if pinned else None
        self.lt = None                                   # the LazyTensor that last used `out`
        self.pinned = pinned
        self.extras: dict[str, torch.Tensor] = {}        # token-level outputs' host buffers (grown, reused)
        # views made once and reused (slicing a tensor costs a dispatcher call on every step)
        self._views: dict[Layout, tuple[torch.Tensor, torch.Tensor]] = {}
        self._out_rows: dict[int, torch.Tensor] = {}

    def layout_views(self, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """(the staging's first layout.words words, its cu_seqlens range) for `layout`."""
        v = self._views.get(layout)
        if v is None:
            v = self._views[layout] = (self.staging[:layout.words], self.staging[layout.cu])
        return v

    def out_rows(self, n: int) -> torch.Tensor:
        """The first n rows of `out` (n <= its rows)."""
        v = self._out_rows.get(n)
        if v is None:
            v = self._out_rows[n] = self.out[:n]
        return v

    def extras_host(self, extras: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host buffers of `extras`' shapes for this slot's batch: views of buffers kept per name and
        grown (rows to a power of two) when too small, so a step allocates no pinned memory."""
        out = {}
        for name, t in extras.items():
            buf = self.extras.get(name)
            n = t.shape[0]
            if buf is None or buf.shape[0] < n or buf.shape[1:] != t.shape[1:] or buf.dtype != t.dtype:
                rows = 1 << max(10, (n - 1).bit_length())
                buf = self.extras[name] = torch.empty((rows, *t.shape[1:]), dtype=t.dtype, pin_memory=self.pinned)
            out[name] = buf[:n]
        return out


class SlotRing:
    """The engine's ring of Slots, taken in turn: max_inflight + 1, so that a caller holding at most
    max_inflight handles never finds its next slot busy (one that is, is detached first)."""

    def __init__(self, slots: list[Slot]):
        self._slots, self._next = slots, 0

    def take(self) -> Slot:
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.lt is not None and not slot.lt.done:
            slot.lt.detach()      # the caller holds more than max_inflight handles; also: staging read
        return slot

    def __iter__(self):
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


class DeviceViews:
    """Device views of one configuration into the engine's static input buffer."""
    __slots__ = ("ids", "pos", "seq", "cu", "inv", "words", "layout", "inputs")

    def __init__(self, buf: torch.Tensor, layout: Layout):
        self.layout = layout
        self.inputs = buf[:layout.words]                                                # the copy's target
        self.ids, self.pos, self.seq = buf[layout.ids], buf[layout.pos], buf[layout.seq]   # [Tb] int32 each
        self.cu = buf[layout.cu]                                                        # [Sb + 2] int32
        self.inv = buf[layout.inv].view(torch.float32).unsqueeze(1)                     # [Sb + 1, 1] f32
        self.words = layout.words


LONE_TEMPLATE_MAX_TOKENS = 1024       # token buckets up to this keep lone-sequence templates (12 KB each at most)


@functools.lru_cache(maxsize=512)
def lone_template(sb: int, tb: int, t: int, pad_id: int) -> np.ndarray:
    """The staged words of one sequence of t tokens in layout (sb, tb), with the ids region holding
    padding: what `stage` writes for such a batch except its ids (read-only; cached)."""
    layout = Layout(sb, tb)
    out = np.zeros(layout.words, dtype=np.int32)
    out[layout.ids] = pad_id
    pos, seq, cu = out[layout.pos], out[layout.seq], out[layout.cu]
    pos[:t] = np.arange(t, dtype=np.int32)
    seq[t:] = sb
    cu[1:sb + 1] = t
    cu[sb + 1] = tb
    inv = out[layout.inv].view(np.float32)
    inv[0] = 1.0 / t
    out.flags.writeable = False
    return out


def stage_lone(input_ids: np.ndarray, layout: Layout, out: np.ndarray, pad_id: int, arange: np.ndarray) -> int:
    """`stage` for one sequence (the online case): in a small layout two copies, its cached template
    (`lone_template`) then its ids; past that, scalars and slices (no per-token index math): on
    this path each numpy call's fixed cost counts."""
    t, sb, tb = input_ids.shape[0], layout.sb, layout.tb
    if tb <= LONE_TEMPLATE_MAX_TOKENS:
        out[:layout.words] = lone_template(sb, tb, t, pad_id)
        out[:t] = input_ids
        return layout.words
    ids, pos, seq, cu = out[layout.ids], out[layout.pos], out[layout.seq], out[layout.cu]
    inv = out[layout.inv].view(np.float32)
    ids[:t] = input_ids
    ids[t:] = pad_id
    pos[:t] = arange[:t]
    pos[t:] = 0
    seq[:t] = 0
    seq[t:] = sb                                              # padding rows pool into the dummy
    cu[0] = 0
    cu[1:sb + 1] = t
    cu[sb + 1] = tb
    inv[0] = 1.0 / t
    inv[1:] = 0.0
    return layout.words


def stage(batch: PackedBatch, layout: Layout, out: np.ndarray, pad_id: int, arange: np.ndarray,
          positions: np.ndarray | None = None) -> int:
    """Write `batch` padded to `layout` into `out` (a slot's int32 staging); return the words used.
    `arange` is a cached 0..Tb-1; `positions` overrides the per-sequence positions (token types)."""
    s, t, sb, tb = batch.num_seqs, batch.num_tokens, layout.sb, layout.tb
    if s == 1 and positions is None:
        return stage_lone(batch.input_ids, layout, out, pad_id, arange)
    ids, pos, seq, cu = out[layout.ids], out[layout.pos], out[layout.seq], out[layout.cu]
    inv = out[layout.inv].view(np.float32)
    ids[:t] = batch.input_ids
    ids[t:] = pad_id
    pos[t:] = 0
    seq[t:] = sb                                              # padding rows pool into the dummy
    cu[0] = 0
    lens = batch.seq_lens.astype(np.int32, copy=False)
    pos[:t] = batch.positions() if positions is None else positions
    seq[:t] = np.repeat(np.arange(s, dtype=np.int32), lens)
    np.cumsum(lens, out=cu[1:s + 1])
    cu[s + 1:sb + 1] = t                                  # empty sequences
    inv[:s] = 1.0 / lens
    inv[s:] = 0.0
    cu[sb + 1] = tb                                           # the dummy holds the padding
    return layout.words
