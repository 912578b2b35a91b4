"""StreamConnection keeps `tokenize` (not decoupled) off the stream that carries decoupled models: on
Triton 2.51 one stream carrying both can abort the whole server (a non-decoupled answer is written
over a write in progress). Against the session's real tritonserver: requests to `tokenize` and to
`embed` / `rose` sent interleaved on one StreamConnection are all answered, each as the same request
alone answers, the `tokenize` ones on the connection's second stream."""
from __future__ import annotations

import numpy as np
import pytest

from rose_client import ConnectionLost, StreamConnection

TEXTS = ["Paris is the capital of France.", "the rose is a flower", "a", "search servers answer " * 20]


def test_tokenize_goes_on_a_stream_of_its_own_beside_decoupled_models(server):
    alone = StreamConnection(server.grpc_url, split_unary=False)      # one model per stream: safe
    try:
        tokens = alone.infer("tokenize", [("TEXT", TEXTS)]).result(60)
    finally:
        alone.close()
    assert alone.unary_stream is None
    conn = StreamConnection(server.grpc_url)
    try:
        embedded = conn.infer("embed", [("TEXT", TEXTS)]).result(60)["EMBEDDINGS"]
        assert conn.unary_stream is None                       # opened at the first request that needs it
        futures = []
        for i in range(20):                                    # all in flight together, interleaved
            futures.append(("tokenize", conn.infer("tokenize", [("TEXT", TEXTS)])))
            futures.append(("embed", conn.infer("embed", [("TEXT", TEXTS)])))
            futures.append(("rose", conn.infer("rose", [("INPUT_IDS", tokens["INPUT_IDS"]),
                                                        ("SEQ_LENS", tokens["SEQ_LENS"])])))
        for model, fut in futures:
            got = fut.result(120)
            if model == "tokenize":
                assert all(np.array_equal(got[k], tokens[k]) for k in ("INPUT_IDS", "SEQ_LENS"))
            else:
                np.testing.assert_allclose(got["EMBEDDINGS"], embedded, atol=1e-5)
        assert conn.unary_stream is not None and conn.unary_stream.channel is conn.channel
        assert conn.outstanding == 0
    finally:
        conn.close()
    with pytest.raises(ConnectionLost):                        # closed with the connection
        conn.unary_stream.infer("tokenize", [("TEXT", TEXTS)]).result(10)
    assert server.proc.poll() is None
