"""The memory budget on a real tritonserver (CPU): `rose` with a memory_limit_mb below its budget
refuses to load, naming each part and the limit; with exactly enough it loads, logs the budget,
serves, and exports it as gauges."""
from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.memory_budget import MIB, engine_budget
from rose_backend.triton.engine_options import engine_options
from rose_backend.triton.model_settings import RoseSettings
from rose_backend.launch.triton_install import LaunchError
from support.server import running_server
from support.metrics import series


def deployed_budget():
    """The budget of the default deployment's `rose` on the CPU, as initialize() computes it."""
    s, cfg = RoseSettings(), ModelConfig.from_folder(None)
    return engine_budget(cfg, "cpu", engine_options(s, cfg, "cpu"))


def budget_gauges(server) -> dict[str, float]:
    return {labels["part"]: v for labels, v in series(server, "rose_memory_budget_bytes") if "part" in labels}


def test_a_budget_over_memory_limit_mb_refuses_to_load_naming_each_part():
    budget = deployed_budget()
    limit_mb = math.floor(budget.total / MIB) - 1
    assert limit_mb > 0
    with pytest.raises(LaunchError, match="before it was ready") as e:      # `rose` alone: the server exits sooner
        with running_server(params={"rose": {"memory_limit_mb": str(limit_mb)}}, name="budget-refused", timeout=180,
                            models=("rose",)):
            pass
    log = open(re.search(r"see (\S+)$", str(e.value)).group(1)).read()
    line = next((ln for ln in log.splitlines() if "the memory budget does not fit" in ln), None)
    assert line is not None, log[-3000:]
    assert "rose: cannot start: the memory budget does not fit on cpu: " in line
    for part, mib in budget.parts_mib().items():
        assert f"{part} {mib:.0f} MiB" in line, (part, line)
    assert f"= {budget.total / MIB:.0f} MiB, over the limit of {limit_mb} MiB" in line, line
    assert "failed to load 'rose'" in log or "failed to load all models" in log


def test_a_budget_that_fits_loads_logs_serves_and_exports_its_parts():
    from rose_client import EmbeddingClient

    budget = deployed_budget()
    limit_mb = math.ceil(budget.total / MIB)
    with running_server(params={"rose": {"memory_limit_mb": str(limit_mb)}}, name="budget-fits", timeout=180,
                        models=("rose",)) as srv:
        with EmbeddingClient(srv.grpc_url) as client:
            emb = client.embed_tokens([[101, 7592, 2088, 102], [101, 2088, 102]])
        assert emb.shape == (2, 384) and np.isfinite(emb).all()
        log = open(srv.log_file).read()
        assert f"rose: memory budget on cpu: {budget.describe()} (limit {limit_mb} MiB)" in log
        expected = {part: float(v) for part, v in vars(budget).items()}     # parts of 0 may be left unset
        deadline = time.monotonic() + 30
        while not all((gauges := budget_gauges(srv)).get(part, 0.0) == v for part, v in expected.items()):
            assert time.monotonic() < deadline, (gauges, expected)
            time.sleep(0.5)
        assert gauges["weights"] == budget.weights > 0 and gauges["activations"] == budget.activations > 0
