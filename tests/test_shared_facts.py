"""Facts kept in one home each, read by more than one side: the gateway's command line takes its
defaults from its settings; the server takes the lane names from the client's contract, which loads
nothing else of the client; no command line takes a key."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rose_backend.serving import lanes
from rose_client import contract


def test_the_server_takes_the_lane_names_from_the_clients_contract_which_loads_nothing_else():
    assert lanes.LANES is contract.LANES and (lanes.INTERACTIVE, lanes.BULK) == contract.LANES
    loaded = subprocess.run([sys.executable, "-c", "import sys, rose_client.contract, rose_client.auth, "
                             "rose_client.env_vars; print(sorted(m for m in sys.modules if m.startswith("
                             "('rose_client', 'grpc', 'tritonclient'))))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['rose_client', 'rose_client.auth', 'rose_client.contract', 'rose_client.env_vars']", loaded
    from rose_client import EmbeddingClient             # the package's names still import, on first use
    assert EmbeddingClient.__module__ == "rose_client.client"


def test_the_clients_unary_models_are_the_repositorys_models_that_are_not_decoupled():
    """contract.UNARY_MODELS (the models StreamConnection keeps off its decoupled stream) against the
    shipped repository's configs (ensembles of decoupled steps answer as decoupled) and the reranker's
    generated copies of them."""
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, RERANKER_STEPS
    unary = set()
    for cfg in DEFAULT_REPOSITORY.glob("*/config.pbtxt"):
        text = cfg.read_text()
        if "decoupled: true" not in text and 'platform: "ensemble"' not in text:
            unary.add(cfg.parent.name)
    unary |= {copy for copy, source in RERANKER_STEPS.items() if source in unary}
    assert unary == set(contract.UNARY_MODELS) == {"tokenize", "rerank_tokenize"}


def test_the_gateway_command_line_defaults_are_its_settings_defaults(monkeypatch):
    from rose_gateway.settings import GatewaySettings, parse_args
    for var in ("API_KEY", "GATEWAY_WORKERS"):
        monkeypatch.delenv(var, raising=False)
    settings, _ = parse_args([])
    own = [f for f in dataclasses.fields(GatewaySettings) if f.default is not dataclasses.MISSING]
    differ = {f.name: (getattr(settings, f.name), f.default) for f in own
              if f.name != "workers" and getattr(settings, f.name) != f.default}
    assert not differ, differ                   # workers: the command line's default is the usable cores
    assert len(own) > 15


@pytest.mark.parametrize("option", ["--api-key", "--admin-key"])
def test_no_command_line_takes_a_key(option, capsys):
    from rose_backend.launch.args import parse_args as launcher_args
    from rose_client.cli import parser as embed_parser
    from rose_gateway.settings import parse_args as gateway_args
    for parse in (lambda a: embed_parser().parse_args(["in.txt", "out.npy", *a]), gateway_args,
                  lambda a: launcher_args(a, "rose")):
        with pytest.raises(SystemExit) as e:
            parse([option, "s3cret-on-argv"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{option} is not taken" in err and "API_KEY" in err, err
        assert "s3cret" not in err
