"""The benchmarks of the rose embedding server, one package with one entry point:

    python -m rose_bench e2e --model bge-m3 --quick        # this deployment against a naive Triton one
    python -m rose_bench multi-gpu --model bge-m3 --gpus 0,1
    python -m rose_bench engine                            # the engine alone, BGE-M3 shape (GPU)
    python -m rose_bench attention-sweep                   # writes the engine's attention-backend table
    python -m rose_bench forward-profile                   # device time and kernels per shape / backend (GPU)
    python -m rose_bench host-path                         # one request's host path, per stage
    python -m rose_bench tail                              # where a concurrent load's slowest requests spend their time
    python -m rose_bench lanes --model bge-m3              # queries beside a bulk load (--modelled-device: no GPU)
    python -m rose_bench query-overlap                     # the query lane's engine beside bulk batches, engine level
    python -m rose_bench http                              # the HTTP gateway beside gRPC embed and rose (perf_analyzer)
    python -m rose_bench tokenize                          # `tokenize` per request: in process and through tritonserver
    python -m rose_bench readiness                         # launch -> READY, each shape's first request vs its p50
    python -m rose_bench soak --minutes 8                  # many clients, mixed traffic and faults, then SIGTERM
    python -m rose_bench retrieval --shape bge-m3          # BGE-M3's sparse + ColBERT outputs vs dense only
    python -m rose_bench rerank --shape bge-reranker-v2-m3 # `rerank` against a naive Triton reranker
    python -m rose_bench stub-recovery                     # a stub killed under load: errors, readiness, recovery
    python -m rose_bench fp8-accuracy                      # dtype=fp8 against bf16 and float32 over a text corpus
    python -m rose_bench cells --model bge-m3 --baseline B.json # every workload cell, twice, against a baseline
    python -m rose_bench merge OUT.json RUN.json ...       # join end-to-end runs of one model
    python -m rose_bench render-readme                     # README's and docs/PERFORMANCE.md's tables from the JSON
    python -m rose_bench charts                            # docs/images/: a results chart per shape, the request path
    python -m rose_bench charts RESULT.json                # redraw one run's per-workload charts
    python -m rose_bench perf-inputs --vocab 250002        # perf_analyzer input files

`python -m rose_bench SUBCOMMAND --help` describes each. Each writes into its --out; the
results kept in the repository are benchmarks/results/<bench>/<model>-<gpu>.json (benchmarks/results/README.md).
rose_bench is its own distribution, not part of the product (benchmarks/pyproject.toml): install it
with `pip install -e ./benchmarks` beside the project and the client (make test installs all three)
and run from the repository root: random-weight model folders come from rose_testing there (not
installed); the benchmarks' own model repositories are benchmarks/repositories/.
"""
