"""What a request may say beyond its tensors, as the client and the gateway spell it.

LANES: the values of the request parameter "lane" (rose schedules "interactive" work before "bulk";
a request that names none is placed by its size). INT32_MAX: the largest value an int32 input carries
(a token id, DIMENSIONS, a rerank's top_n). The server keeps its own copy of the lane names
(rose_backend/serving/lanes.py), so that its Python stubs need not import this package;
tests/test_shared_facts.py checks that the two agree. No imports: any side may take it.
"""
INTERACTIVE, BULK = "interactive", "bulk"
LANES = (INTERACTIVE, BULK)
INT32_MAX = (1 << 31) - 1
