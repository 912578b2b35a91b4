"""Requested outputs, named as any Triton client names them (plain tritonclient over a gRPC stream),
are sent or refused with an error naming them, never left out: on a real tritonserver serving a
random-weight BGE-M3 folder (rose_testing/m3_folders.py) and the default model (no heads).

First what Triton 2.51 itself does, on a probe repository of its own (the facts the design stands
on: rose_backend/serving/output_choice.py): an ensemble step is asked for every mapped output
whatever the client named, neither its request nor its parameters carry the names, and an output
named but not sent is silently absent. Then the product: `embed` declares EMBEDDINGS only (Triton
refuses the other names itself), `encode` sends exactly the named outputs with the values of the
`outputs`-parameter path of `rose`, and every request that names what will not be sent is refused.
"""
import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.server import M3_MAX_LEN

pytestmark = pytest.mark.server

MAX_LEN = M3_MAX_LEN          # the session's M3 folder (conftest's m3_deployment)
TEXTS = ["the rose is a flower", "the rose the rose is red red red", "a",
         " ".join(["hybrid search with lexical weight and dense vector"] * 8),       # cut at MAX_LEN
         "late interaction colbert model server token"]
OTHERS = ("SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS", "COLBERT", "COLBERT_LENS", "TOKEN_COUNTS", "TRUNCATED")
EVERY = ("EMBEDDINGS", *OTHERS)
COUNTS = ("TOKEN_COUNTS", "TRUNCATED")


class Stream:
    """A plain tritonclient gRPC stream: one request at a time, its one answer or its error text."""

    def __init__(self, url: str):
        self.url = url
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def infer(self, model: str, inputs: dict, outputs=None, parameters=None, timeout: float = 120):
        """{name: array} of the answer, or the error's message (a str)."""
        tensors = []
        for name, value in inputs.items():
            value = np.asarray(value, dtype=object) if isinstance(value, list) else value
            t = grpcclient.InferInput(name, list(value.shape), "BYTES" if value.dtype == object else
                                      {np.int32: "INT32", np.bool_: "BOOL"}[value.dtype.type])
            t.set_data_from_numpy(value)
            tensors.append(t)
        asked = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
        self.client.async_stream_infer(model, tensors, outputs=asked, parameters=parameters)
        result, error = self.answers.get(timeout=timeout)
        if error is not None:
            return str(error.message())
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}

    def close(self):
        self.client.stop_stream()
        self.client.close()


def answer(stream, *args, **kwargs) -> dict:
    got = stream.infer(*args, **kwargs)
    assert not isinstance(got, str), got
    return got


def refused(stream, *args, **kwargs) -> str:
    got = stream.infer(*args, **kwargs)
    assert isinstance(got, str), f"answered {sorted(got)} where an error was due"
    return got


# ----------------------------------------------------------------------------- what Triton does
PROBE = '''import json
import os
import sys

sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)       # as the product's model.py files
from rose_backend.triton.stub_path import launcher_paths_first
launcher_paths_first()

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            seen = {"requested": sorted(r.requested_output_names()), "parameters": json.loads(r.parameters() or "{}"),
                    "inputs": sorted(t.name() for t in r.inputs())}
            out = [pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=object))]
            out += [pb_utils.Tensor(n, np.array([1], np.int32)) for n in ("A", "B") if n != seen["parameters"].get("skip")]
            r.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=out),
                                         flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
OUTS = [("SEEN", "TYPE_STRING"), ("A", "TYPE_INT32"), ("B", "TYPE_INT32")]


def probe_repository(root):
    """`probe` (decoupled Python: answers what its request showed it) and `probe_ensemble` over it."""
    outputs = "output [ " + ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in OUTS) + " ]\n"
    x = 'input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    (root / "probe" / "1").mkdir(parents=True)
    (root / "probe" / "1" / "model.py").write_text(PROBE)
    (root / "probe" / "config.pbtxt").write_text(
        'name: "probe"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        + x + outputs + "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    (root / "probe_ensemble" / "1").mkdir(parents=True)
    maps = " ".join(f'output_map {{ key: "{n}" value: "{n}" }}' for n, _ in OUTS)
    (root / "probe_ensemble" / "config.pbtxt").write_text(
        'name: "probe_ensemble"\nplatform: "ensemble"\nmax_batch_size: 0\n' + x + outputs
        + f'ensemble_scheduling {{ step [ {{ model_name: "probe" model_version: -1 '
          f'input_map {{ key: "X" value: "X" }} {maps} }} ] }}\n')
    return root


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from support.server import LOG_DIR, TEST_EXIT_TIMEOUT_S, TritonProcess, free_ports, stop_in_background
    from rose_backend.launch.tritonserver import ServerOptions
    repo = probe_repository(tmp_path_factory.mktemp("probe"))
    LOG_DIR.mkdir(exist_ok=True)
    srv = TritonProcess(None, repo, free_ports(), log_file=LOG_DIR / "probe.log",
                        options=ServerOptions(exit_timeout=TEST_EXIT_TIMEOUT_S))
    try:
        srv.start().wait_ready(120, models=("probe", "probe_ensemble"))
        s = Stream(srv.grpc_url)
        yield s
        s.close()
    finally:
        stop_in_background([srv])


X = {"X": np.array([1], np.int32)}


def test_triton_shows_an_ensemble_step_no_requested_names(probe):
    direct = answer(probe, "probe", X, outputs=["SEEN", "A"], parameters={"k": "v"})
    assert json.loads(direct["SEEN"][0])["requested"] == ["A", "SEEN"] and set(direct) == {"SEEN", "A"}
    through = answer(probe, "probe_ensemble", X, outputs=["SEEN", "A"], parameters={"k": "v"})
    seen = json.loads(through["SEEN"][0])
    assert seen == {"requested": ["A", "B", "SEEN"], "parameters": {"k": "v"}, "inputs": ["X"]}   # names: nowhere
    assert set(through) == {"SEEN", "A"}                         # Triton keeps to the names on the way out
    none_named = answer(probe, "probe", X)
    assert json.loads(none_named["SEEN"][0])["requested"] == ["A", "B", "SEEN"]   # none named: every one


def test_triton_leaves_out_a_named_output_that_is_not_sent(probe):
    for model in ("probe", "probe_ensemble"):
        got = answer(probe, model, X, outputs=["SEEN", "B"], parameters={"skip": "B"})
        assert set(got) == {"SEEN"}                              # no error: hence the refusals of this design


def test_triton_refuses_an_undeclared_output_itself(probe):
    for model in ("probe", "probe_ensemble"):
        assert f"unexpected inference output 'C' for model '{model}'" in refused(probe, model, X, outputs=["A", "C"])


# ----------------------------------------------------------------------------- the product
@pytest.fixture(scope="module")
def m3(m3_deployment):
    """A stream to the session's M3 server (conftest's m3_deployment: small batches)."""
    s = Stream(m3_deployment[2].grpc_url)
    yield s
    s.close()


@pytest.fixture(scope="module")
def by_parameter(m3):
    """Every output through the `outputs` parameter path of `rose` (naming none), from the ids,
    counts and cut marks of the `tokenize` model (named there: a direct call sees its names)."""
    tokens = answer(m3, "tokenize", {"TEXT": TEXTS}, outputs=["INPUT_IDS", "SEQ_LENS", "TOKEN_COUNTS", "TRUNCATED"])
    assert tokens["TRUNCATED"].tolist() == [False, False, False, True, False]
    return answer(m3, "rose", tokens, parameters={"outputs": "sparse,colbert,token_counts,truncated"})


def same(got: dict, want: dict, names) -> None:
    assert set(got) == set(names), f"sent {sorted(got)}, named {sorted(names)}"
    for n in names:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
        if got[n].dtype == np.float32:
            np.testing.assert_allclose(got[n], want[n], atol=2e-6, err_msg=n)
        else:
            np.testing.assert_array_equal(got[n], want[n], err_msg=n)


def test_the_reference_holds_every_output(by_parameter):
    assert set(by_parameter) == set(EVERY)
    assert by_parameter["SPARSE_LENS"].sum() > len(TEXTS) and by_parameter["COLBERT"].shape[1] == 64
    assert by_parameter["TOKEN_COUNTS"][3] > MAX_LEN and by_parameter["TRUNCATED"].tolist()[3]


@pytest.mark.parametrize("name", EVERY)
def test_encode_sends_each_output_named_alone(m3, by_parameter, name):
    same(answer(m3, "encode", {"TEXT": TEXTS}, outputs=[name]), by_parameter, [name])


def test_encode_sends_what_is_named_together_or_none_named(m3, by_parameter):
    for names in (["EMBEDDINGS", "SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS"], ["COLBERT", "COLBERT_LENS", "TRUNCATED"],
                  ["TOKEN_COUNTS", "EMBEDDINGS"], list(EVERY)):
        same(answer(m3, "encode", {"TEXT": TEXTS}, outputs=names), by_parameter, names)
    same(answer(m3, "encode", {"TEXT": TEXTS}), by_parameter, EVERY)                # Triton's convention: all
    by_kind = answer(m3, "encode", {"TEXT": TEXTS}, parameters={"outputs": "colbert"})   # the parameter, none named
    same(by_kind, by_parameter, ["EMBEDDINGS", "COLBERT", "COLBERT_LENS"])


def test_encode_passes_dimensions_encoding_and_parameters_on(m3, by_parameter):
    got = answer(m3, "encode", {"TEXT": TEXTS, "ENCODING": ["binary"]}, outputs=["EMBEDDINGS", "SPARSE_LENS"])
    np.testing.assert_array_equal(got["EMBEDDINGS"], (np.packbits(by_parameter["EMBEDDINGS"] > 0, axis=-1) - 128)
                                  .astype(np.int8))
    np.testing.assert_array_equal(got["SPARSE_LENS"], by_parameter["SPARSE_LENS"])
    cut = answer(m3, "encode", {"TEXT": TEXTS, "DIMENSIONS": np.array([16], np.int32)}, outputs=["EMBEDDINGS"])
    assert cut["EMBEDDINGS"].shape == (len(TEXTS), 16)
    assert "lane" in refused(m3, "encode", {"TEXT": TEXTS}, outputs=["EMBEDDINGS"], parameters={"lane": "fast"})


def test_embed_declares_only_what_it_sends(m3, by_parameter):
    same(answer(m3, "embed", {"TEXT": TEXTS}, outputs=["EMBEDDINGS"]), by_parameter, ["EMBEDDINGS"])
    same(answer(m3, "embed", {"TEXT": TEXTS}), by_parameter, ["EMBEDDINGS"])
    for name in OTHERS:
        message = refused(m3, "embed", {"TEXT": TEXTS}, outputs=["EMBEDDINGS", name])
        assert f"unexpected inference output '{name}' for model 'embed'" in message
    for kind, name in (("sparse", "SPARSE_IDS"), ("colbert", "COLBERT"), ("token_counts", "TOKEN_COUNTS"),
                       ("truncated", "TRUNCATED")):           # the parameter cannot get them through either
        message = refused(m3, "embed", {"TEXT": TEXTS}, parameters={"outputs": kind})
        assert name in message and "`encode`" in message, message


def test_rose_refuses_names_it_will_not_send(m3, by_parameter):
    tokens = answer(m3, "tokenize", {"TEXT": TEXTS}, outputs=["INPUT_IDS", "SEQ_LENS"])
    same(answer(m3, "rose", tokens, outputs=["SPARSE_IDS"]), by_parameter, ["SPARSE_IDS"])
    assert "output SCORES" in refused(m3, "rose", tokens, outputs=["EMBEDDINGS", "SCORES"])
    message = refused(m3, "rose", tokens, outputs=["EMBEDDINGS", "SPARSE_IDS"], parameters={"outputs": "colbert"})
    assert "SPARSE_IDS" in message and "leaves them out" in message
    message = refused(m3, "encode", {"TEXT": TEXTS}, outputs=["TOKEN_COUNTS"], parameters={"outputs": "truncated"})
    assert "TOKEN_COUNTS" in message


def test_a_model_without_heads_refuses_them_by_name(server):
    s = Stream(server.grpc_url)
    try:
        for name in ("SPARSE_WEIGHTS", "COLBERT_LENS"):
            message = refused(s, "encode", {"TEXT": ["a"]}, outputs=["EMBEDDINGS", name])
            assert name in message and "BGE-M3's heads" in message, message
        assert "BGE-M3's heads" in refused(s, "encode", {"TEXT": ["a"]})       # none named: all, which it lacks
        got = answer(s, "encode", {"TEXT": ["a", "b c"]}, outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"])
        assert got["TOKEN_COUNTS"].tolist() == [3, 4] and not got["TRUNCATED"].any()
        dense = answer(s, "embed", {"TEXT": ["a", "b c"]})["EMBEDDINGS"]
        np.testing.assert_allclose(got["EMBEDDINGS"], dense, atol=1e-6)
    finally:
        s.close()


def test_encode_late_chunking_sends_counts_and_refuses_colbert_by_name(m3):
    documents = {"TEXT": ["the rose ", "is a flower", "dense vector"], "DOC_CHUNKS": np.array([2, 1], np.int32)}
    got = answer(m3, "encode", documents, outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"])
    same(got, answer(m3, "embed", documents) | {n: got[n] for n in COUNTS}, ["EMBEDDINGS", *COUNTS])
    assert got["EMBEDDINGS"].shape[0] == 3 and got["TOKEN_COUNTS"].min() >= 1 and not got["TRUNCATED"].any()
    message = refused(m3, "encode", documents, outputs=["EMBEDDINGS", "COLBERT"])
    assert "output COLBERT" in message and "late chunking" in message, message


def test_a_cancelled_encode_request_is_dropped_and_the_model_keeps_serving(m3):
    from rose_client import StreamConnection
    conn = StreamConnection(m3.url)
    try:
        futures = [conn.infer("encode", [("TEXT", [f"{TEXTS[3]} {i}"] * 16)], ["COLBERT", "COLBERT_LENS"])
                   for i in range(20)]
    finally:
        conn.close()                                  # the stream goes: its requests are cancelled
    assert all(f.exception(60) is not None for f in futures)         # nothing answered after the close
    same(answer(m3, "encode", {"TEXT": TEXTS}, outputs=["SPARSE_IDS"]), answer(m3, "encode", {"TEXT": TEXTS}),
         ["SPARSE_IDS"])
