"""Graph cache: bucketing and the lazy-capture state machine (CPU, no CUDA needed)."""
import pytest
import torch

from rose_backend.engine.graph_cache import GraphCache, pick, seq_buckets, token_buckets


def test_token_buckets_64_then_256():
    b = token_buckets(8192)
    assert b[:3] == [64, 128, 192] and 1024 in b and 1088 not in b
    assert b[b.index(1024) + 1] == 1280 and b[-1] == 8192 and len(b) == 44
    assert all(x % 64 == 0 for x in b) and all(x % 256 == 0 for x in b if x > 1024)


def test_seq_buckets_and_pick():
    assert seq_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert seq_buckets(100)[-1] == 128
    b = token_buckets(4096)
    assert pick(b, 1) == 64 and pick(b, 64) == 64 and pick(b, 65) == 128
    assert pick(b, 1025) == 1280 and pick(b, 4097) is None


@pytest.mark.parametrize("seqs,tokens,key", [(1, 1, (1, 64)), (3, 130, (4, 192)), (64, 4096, (64, 4096)),
                                              (5, 1100, (8, 1280))])
def test_key_for(seqs, tokens, key):
    assert GraphCache(8192, 64).key_for(seqs, tokens) == key


def test_key_for_too_large_is_none():
    c = GraphCache(1024, 16)
    assert c.key_for(17, 100) is None and c.key_for(2, 1025) is None


def test_state_machine_eager_capture_replay():
    c = GraphCache(1024, 8)
    c.start(torch.device("cpu"))
    k = c.key_for(2, 100)
    assert c.action(k) == "eager"
    assert c.action(k) == "capture"
    out = c.capture(k, lambda: torch.ones(3))
    assert c.entries[k].state == "captured" and out.shape == (3,)
    assert c.action(k) == "replay" and c.action(k) == "replay"
    other = c.key_for(1, 10)
    assert c.action(other) == "eager" and c.num_captured == 1


def test_disabled_cache_always_eager():
    c = GraphCache(1024, 8, enabled=False)
    k = (1, 64)
    assert [c.action(k) for _ in range(4)] == ["eager"] * 4


def test_memory_cap_stops_new_captures():
    c = GraphCache(1024, 8, memory_cap_bytes=0)
    c.start(torch.device("cpu"))
    a, b = (1, 64), (2, 64)
    c.action(a), c.action(a)
    c.capture(a, lambda: torch.zeros(1))
    assert c.full                                     # cap 0 reached by the first graph
    assert c.action(a) == "replay"                    # kept graphs still replay
    assert c.action(b) == "eager" and c.action(b) == "eager" and c.refused == 1


def test_cpu_graph_replays_into_the_same_output():
    c = GraphCache(1024, 8)
    c.start(torch.device("cpu"))
    x = torch.zeros(4)
    k = (1, 64)
    c.action(k), c.action(k)
    out = c.capture(k, lambda: x * 2)
    x.fill_(3)
    assert c.replay(k) is out and torch.equal(out, torch.full((4,), 6.0))


def test_cpu_graphs_hold_their_static_outputs():
    c = GraphCache(1024, 8)
    c.start(torch.device("cpu"))
    for key, fn in (((1, 64), lambda: torch.zeros(3, 4)), ((2, 64), lambda: (torch.zeros(5), torch.zeros(2, 2)))):
        c.action(key), c.action(key)
        c.capture(key, fn)
    assert c.graph_bytes() == (12 + 5 + 4) * 4


def test_engine_runs_eagerly_past_its_graph_memory_cap_and_stays_correct(minilm_shaped_dir):
    """graphs=True on the CPU: the bucketed static-buffer path with stand-in graphs. A cap of one
    graph's output: the first configuration is captured, later ones run eagerly, counted as refused."""
    import numpy as np

    from rose_backend.config import ModelConfig
    from rose_backend.engine.batch import PackedBatch
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions

    cfg = ModelConfig.from_folder(minilm_shaped_dir)
    one_graph = (8 + 1) * cfg.embedding_dim * 4                      # [Sb + 1, D] float32, Sb = 8
    eng = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=512, max_seqs=8,
                                            graph_memory_cap_bytes=one_graph))
    ref = Engine(cfg, options=EngineOptions(graphs=False))
    rng = np.random.default_rng(0)
    batches = [PackedBatch(rng.integers(1000, 2000, n * L, dtype=np.int32), np.full(n, L, dtype=np.int32))
               for n, L in ((5, 20), (1, 100), (3, 150))]               # buckets (8, 128), (1, 128), (4, 512)
    for i, b in enumerate(batches):
        for sight in range(3):
            got = eng.step(b).synchronize()
            np.testing.assert_allclose(got, ref.step(b).synchronize(), atol=2e-5, err_msg=f"batch {i} sight {sight}")
    st = eng.stats
    assert st.graph_captures == 1 and st.graphs == 1 and st.graph_memory_bytes == one_graph
    assert st.graph_replays == 1                                      # the first configuration's third sight
    assert st.capture_refused == 4 and eng.graphs.refused == 4        # sights 2 and 3 of the other two
    assert st.eager_runs == 1 + 3 + 3
    uncapped = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=512, max_seqs=8))
    for b in batches:
        for _ in range(3):
            uncapped.step(b).synchronize()
    assert uncapped.stats.graph_captures == 3 and uncapped.stats.capture_refused == 0


def test_forced_out_of_memory_past_the_cap_loses_nothing(minilm_shaped_dir):
    """Past the cap, batches that run out of memory are split and retried (serving/oom_retry.py) on a
    graphs=True engine: every request answered, each equal to the unpadded engine's embedding."""
    import numpy as np

    from rose_backend.config import ModelConfig
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_backend.serving.scheduler import Request
    from support.requests import run_service

    cfg = ModelConfig.from_folder(minilm_shaped_dir)
    # one configuration captured at start fills the cap: every other one runs eagerly from there on
    eng = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=2048, max_seqs=64, graph_memory_cap_bytes=1))
    eng.precapture([(1, 64)])
    assert eng.graphs.full and eng.stats.graph_captures == 1
    ref = Engine(cfg, options=EngineOptions(graphs=False))

    class OutOfMemoryOver:                 # a GPU with room for 150 tokens (a CPU cannot run out)
        refused = 0

        def step(self, batch):
            if batch.num_tokens > 150:
                OutOfMemoryOver.refused += 1
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({batch.num_tokens} tokens, injected)")
            return eng.step(batch)

    rng = np.random.default_rng(1)
    requests = []
    for n in (7, 1, 12, 3, 7, 12):
        lens = rng.integers(1, 60, size=n).astype(np.int32)
        requests.append(Request(rng.integers(1000, 30000, size=int(lens.sum())).astype(np.int32), lens))
    svc, done = run_service(OutOfMemoryOver(), requests, max_batch_tokens=2048, max_batch_seqs=64)
    assert OutOfMemoryOver.refused >= 1 and svc.stats.oom_splits >= 1
    assert all(r.error is None for r in done), [r.error for r in done]
    for r in requests:
        want = np.concatenate([ref.embed([r.input_ids[r.offsets[i]:r.offsets[i + 1]].tolist()])
                               for i in range(r.num_seqs)])
        np.testing.assert_allclose(r.output, want, atol=2e-5)
    assert eng.stats.graph_captures == 1 and eng.stats.graphs == 1              # the cap held throughout
