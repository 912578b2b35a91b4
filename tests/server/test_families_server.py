"""Native families served end to end by a real tritonserver (CPU): a new encoder family (MPNet, with its
relative position bias) and a new decoder family (Gemma 3, bidirectional with sliding windows), each a
random-weight folder (rose_testing.folders), its texts through the `embed` ensemble and token ids
through `rose`, against transformers on the same weights."""
import numpy as np
import pytest

from rose_testing.compare import cos_dist
from rose_testing.folders import ids_to_text, make_folder, random_ids
from rose_testing.reference import Reference

pytestmark = pytest.mark.server


@pytest.fixture(scope="module", params=["tiny-mpnet", "tiny-gemma3"])
def served(request, shared_server, tmp_path_factory):
    folder = make_folder(request.param, tmp_path_factory.mktemp(request.param) / "model")
    return folder, shared_server(None, model_dir=str(folder), name=request.param)


def test_family_served_through_triton_matches_transformers(served):
    from rose_client import EmbeddingClient
    from rose_backend.config import ModelConfig

    folder, srv = served
    cfg = ModelConfig.from_folder(folder)
    rng = np.random.default_rng(4)
    ids = [random_ids(rng, cfg.vocab_size, n).tolist() for n in (1, 5, 40, 23, cfg.max_seq_length + 30)]
    texts = [ids_to_text(s) for s in ids]                     # word i is token i; the last one is cut
    ref = Reference(folder).embed([s[:cfg.max_seq_length] for s in ids])
    client = EmbeddingClient(srv.grpc_url)
    try:
        got = client.embed(texts)
        assert got.shape == (len(texts), cfg.hidden_size) and got.dtype == np.float32
        assert cos_dist(got, ref).max() <= 1e-5
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)      # both folders normalize
        assert cos_dist(client.embed_tokens([s[:cfg.max_seq_length] for s in ids]), ref).max() <= 1e-5
    finally:
        client.close()
