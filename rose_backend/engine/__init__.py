"""The engine (ROSE): step(batch) -> LazyTensor over a model, with graphs and backends on the GPU."""
