"""What a request may say beyond its tensors, as the client and the gateway spell it.

LANES: the values of the request parameter "lane" (rose schedules "interactive" work before "bulk";
a request that names none is placed by its size). INT32_MAX: the largest value an int32 input carries
(a token id, DIMENSIONS, a rerank's top_n). UNARY_MODELS: the deployment's models that are not
decoupled; Triton 2.51 writes their answers on a gRPC stream without waiting for a write in progress
and aborts when that meets a decoupled model's answer on the same stream, so StreamConnection sends
them on a stream of their own. No imports, and importing it loads nothing else of
rose_client (its __init__ imports lazily): the server's scheduler takes the lane names from here.
"""
INTERACTIVE, BULK = "interactive", "bulk"
LANES = (INTERACTIVE, BULK)
INT32_MAX = (1 << 31) - 1
UNARY_MODELS = ("tokenize", "rerank_tokenize")
