"""The client's hand decode of large stream responses (transport._decode) against protobuf's own."""
import numpy as np
import pytest
from rose_client.transport import _LARGE, ServerError, _decode, _outputs
from tritonclient.grpc import service_pb2


def _message(arrays: dict, error: str = "") -> service_pb2.ModelStreamInferResponse:
    m = service_pb2.ModelStreamInferResponse(error_message=error)
    r = m.infer_response
    r.id, r.model_name, r.model_version = "42", "rose", "1"
    r.parameters["triton_final_response"].bool_param = True
    for name, a in arrays.items():
        o = r.outputs.add()
        o.name, o.datatype = name, {"float32": "FP32", "int32": "INT32", "int8": "INT8"}[a.dtype.name]
        o.shape.extend(a.shape)
        r.raw_output_contents.append(a.tobytes())
    return m


@pytest.mark.parametrize("rows", [3, _LARGE // 4096 + 10])          # the protobuf path, the hand path
def test_decode_equals_protobuf(rows):
    rng = np.random.default_rng(rows)
    arrays = {"EMBEDDINGS": rng.normal(size=(4, 16)).astype(np.float32),
              "COLBERT": rng.normal(size=(rows, 1024)).astype(np.float32),
              "COLBERT_LENS": np.arange(4, dtype=np.int32), "EMPTY": np.zeros((0,), np.int8)}
    raw = _message(arrays).SerializeToString()
    resp, contents = _decode(raw)
    assert (contents is None) == (len(raw) < _LARGE)
    ref = service_pb2.ModelStreamInferResponse.FromString(raw)
    assert resp.infer_response.id == "42" and resp.infer_response.parameters == ref.infer_response.parameters
    assert list(resp.infer_response.outputs) == list(ref.infer_response.outputs)
    got = _outputs(resp.infer_response, contents)
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        np.testing.assert_array_equal(got[k], a)
        assert got[k].dtype == a.dtype and got[k].shape == a.shape


def test_large_error_and_bad_datatype():
    big = np.ones((_LARGE // 4 + 1,), np.float32)
    resp, contents = _decode(_message({"COLBERT": big}, error="rose: boom").SerializeToString())
    assert resp.error_message == "rose: boom"
    m = _message({"X": big})
    m.infer_response.outputs[0].datatype = "BF16"
    resp, contents = _decode(m.SerializeToString())
    with pytest.raises(ServerError, match="unexpected output datatype BF16"):
        _outputs(resp.infer_response, contents)


def test_a_malformed_answer_fails_its_request_and_the_stream_lives_on():
    """An answer whose outputs cannot be read (here: a [1, 4] FP32 output without its bytes, as Triton
    2.51's Python backend sends under numpy 2) fails that request with an error instead of leaving
    its caller waiting forever, and the next request on the same stream is answered. A minimal gRPC
    peer serves the stream: no Triton build sends such an answer on purpose."""
    from concurrent import futures

    import grpc
    from rose_client.transport import StreamConnection

    def answer(requests, context):
        for req in requests:
            m = _message({"EMBEDDINGS": np.full((1, 4), 7, np.float32)})
            m.infer_response.id = req.id
            if req.id == "0":
                del m.infer_response.raw_output_contents[:]
            yield m

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc = grpc.stream_stream_rpc_method_handler(answer, request_deserializer=service_pb2.ModelInferRequest.FromString,
                                                response_serializer=service_pb2.ModelStreamInferResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("inference.GRPCInferenceService",
                                                                          {"ModelStreamInfer": rpc})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn = StreamConnection(f"127.0.0.1:{port}")
    try:
        ids = [("INPUT_IDS", np.arange(3, dtype=np.int32))]
        with pytest.raises(ServerError, match="malformed response to request 0"):
            conn.infer("rose", ids).result(10)
        np.testing.assert_array_equal(conn.infer("rose", ids).result(10)["EMBEDDINGS"], np.full((1, 4), 7, np.float32))
    finally:
        conn.close()
        server.stop(0)


def test_a_broken_stream_leaves_no_thread_behind():
    """A stream that breaks (nothing listens at its address) fails its requests with ConnectionLost,
    and gRPC's thread that sends its requests ends with it, closed or not (it waited forever for the
    next request: a client retrying against a dead replica gathered one such thread per attempt)."""
    import threading

    from rose_client.transport import ConnectionLost, StreamConnection
    from rose_testing.waiting import wait_until
    from support.ports import free_port

    before = threading.active_count()
    conns = [StreamConnection(f"127.0.0.1:{free_port()}") for _ in range(3)]
    for conn in conns:
        with pytest.raises(ConnectionLost):
            conn.infer("rose", [("INPUT_IDS", np.arange(3, dtype=np.int32))]).result(30)
    assert wait_until(lambda: threading.active_count() <= before, 10), [t.name for t in threading.enumerate()]
