"""EngineOptions: the defaults an Engine resolves on each device, and what it refuses."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from rose_backend.engine.graph_cache import bucket_limits
from rose_backend.engine.options import EngineOptions


def test_the_defaults_follow_the_device():
    o = EngineOptions()
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert o.torch_dtype(cpu) == torch.float32 and o.torch_dtype(cuda) == torch.bfloat16
    assert not o.graphs_on(cpu) and o.graphs_on(cuda)
    assert EngineOptions(graphs=True).graphs_on(cpu) and not EngineOptions(graphs=False).graphs_on(cuda)
    assert EngineOptions(dtype=torch.float16).torch_dtype(cuda) == torch.float16
    limits = bucket_limits(512)
    assert o.buckets(512) == (limits["max_tokens"], limits["max_seqs"])
    assert EngineOptions(max_tokens=1024, max_seqs=8).buckets(512) == (1024, 8)


@pytest.mark.parametrize("name", [None, "", "auto"])
def test_no_attention_backend_means_the_table_chooses(name):
    assert EngineOptions(attention=name).attention is None
    assert EngineOptions(attention="sdpa_loop").attention == "sdpa_loop"


@pytest.mark.parametrize("field,value", [("max_inflight", 0), ("max_tokens", 0), ("max_seqs", -1),
                                         ("graph_memory_cap_bytes", -1), ("memory_limit_bytes", -1),
                                         ("fp8_min_tokens", -1), ("dtype", "bfloat16")])
def test_values_out_of_range_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"EngineOptions.{field}"):
        EngineOptions(**{field: value})


def test_options_are_frozen_and_replaced_field_by_field():
    o = EngineOptions(attention="sdpa_loop", max_tokens=2048)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.max_tokens = 1
    q = dataclasses.replace(o, max_inflight=1, memory_limit_bytes=0)
    assert (q.attention, q.max_tokens, q.max_inflight, q.memory_limit_bytes) == ("sdpa_loop", 2048, 1, 0)
    with pytest.raises(ValueError, match="max_inflight"):
        dataclasses.replace(o, max_inflight=0)
