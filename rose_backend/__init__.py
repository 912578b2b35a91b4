"""rose_backend: the inference tier of the embedding server (Tulip's scheduler and ROSE's engine).

Layers, each importing only the ones below it:
    launch    process control: tritonserver and the HTTP gateway as child processes (make serve)
    triton    the Triton glue: the `rose` model, config.pbtxt settings, the stubs' helpers
    serving   request pool, FCFS batch former, completion side (independent of Triton)
    engine    step(batch) -> LazyTensor, graph cache, static buffers, backend choice
    models    packed (tokens, hidden) forward passes and pooling
    layers    attention backends, fused norms / activations
    config / loading   model folder -> ModelConfig + weights
Importing the package imports nothing heavy; torch is loaded by the modules that need it.
"""

__version__ = "0.1.0"
