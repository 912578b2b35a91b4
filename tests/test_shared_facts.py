"""Facts kept in one home each, read by more than one side: the gateway's command line takes its
defaults from its settings; the lane names the server keeps (its Python stubs do not import the
client package) are the client's; no command line takes a key."""
from __future__ import annotations

import dataclasses

import pytest

from rose_backend.serving import lanes
from rose_client import contract


def test_the_server_and_the_client_name_the_same_lanes():
    assert (lanes.INTERACTIVE, lanes.BULK, lanes.LANES) == (contract.INTERACTIVE, contract.BULK, contract.LANES)


def test_the_gateway_command_line_defaults_are_its_settings_defaults(monkeypatch):
    from rose_gateway.settings import GatewaySettings, parse_args
    for var in ("TRITON_URLS", "ADDRESS", "GATEWAY_PORT", "MODEL", "API_KEY", "GATEWAY_WORKERS"):
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
