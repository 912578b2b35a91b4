"""`rose` with interactive_stream=on on a real tritonserver (CPU): the query lane's second engine
loads beside the main one, warms up what the query lane's plan names, and its memory budget is counted
(logged, and in the budget gauges), and
queries and bulk requests sent together over gRPC are answered with what sentence-transformers gives
for the same texts."""
import re
import threading
import time

from rose_testing.compare import cos_dist


def test_queries_and_bulk_through_the_query_lane_match_sentence_transformers(minilm_shaped_dir, sentence_model):
    from rose_client import EmbeddingClient
    from support.server import running_server
    queries = [f"where is the capital of country number {i}?" for i in range(6)]
    bulk = [f"document {i}: re-indexing a corpus takes the whole night on a busy cluster." for i in range(200)]
    got = {}
    with running_server(str(minilm_shaped_dir), params={"rose": {"interactive_stream": "on"}}, name="query-lane",
                        timeout=180) as srv:
        with EmbeddingClient(srv.grpc_url) as client:
            t = threading.Thread(target=lambda: got.setdefault("bulk", client.embed(bulk, lane="bulk")))
            t.start()
            got["queries"] = [client.embed([q], lane="interactive")[0] for q in queries]
            t.join(120)
        log = open(srv.log_file).read()
        from support.metrics import series
        both = re.search(r"both engines (\d+) MiB", log)
        deadline = time.monotonic() + 15                 # the gauges are polled one at a time, each once a second
        while both and abs(sum(v for _, v in series(srv, "rose_memory_budget_bytes")) / (1 << 20) - int(both.group(1))) > 1:
            assert time.monotonic() < deadline, series(srv, "rose_memory_budget_bytes")
            time.sleep(0.2)
    assert "rose: cannot start" not in log
    main = re.search(r"rose: memory budget on cpu: .* = (\d+) MiB", log)
    lane = re.search(r"rose: memory budget of the query lane's engine: .*weights 0 MiB.* = (\d+) MiB; both engines (\d+) MiB", log)
    assert main and lane, log[-3000:]
    assert abs(int(main.group(1)) + int(lane.group(1)) - int(lane.group(2))) <= 1     # rounding to MiB
    assert re.search(r"rose: warmed up 1 configurations in [\d.]+ s: \[\(1, 8\)\]", log), log[-3000:]
    assert re.search(r"rose: warmed up the query lane's engine on 1 configurations in [\d.]+ s: \[\(1, 8\)\]", log)
    for texts, key in ((queries, "queries"), (bulk, "bulk")):
        gap = cos_dist(got[key], sentence_model.encode(texts, normalize_embeddings=True))
        assert float(gap.max()) < 1e-5, (key, float(gap.max()))
