"""The launcher watches its HTTP gateway (rose_backend/launch/gateway_watch.py), with real processes: a
gateway killed with SIGKILL is started again and serves; one that keeps dying stops the whole launch
with a message and a non-zero exit; a second launch on the same gateway port refuses to start naming
the port; another process listening on the port later (SO_REUSEPORT) stops the launch."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from support.launcher import LauncherRun
from support.server import repository_with

from support import leftovers
from rose_backend.launch.connections import children


def gateway_pid(run: LauncherRun) -> int:
    """The gateway process the launcher started (its workers are the gateway's own children)."""
    pids = [p for p in children(run.proc.pid) if "rose_gateway" in leftovers.processes(run.prefixes).get(p, "")]
    assert len(pids) == 1, (pids, run.processes())
    return pids[0]


def state_folder(pid: int) -> Path:
    """The worker-state folder a gateway holds the lock of (rose_backend/processes.py)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = Path(os.readlink(fd))
        if target.name == ".owner" and target.parent.name.startswith("rose_gateway_state_"):
            return target.parent
    raise AssertionError(f"gateway {pid} holds no worker-state folder")


def embeds(run: LauncherRun) -> bool:
    try:
        r = httpx.post(run.gateway_url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


def watch_repository(tmp_path) -> str:
    """The test repository (one instance of each tokenize model: its server stops a second or two
    sooner than the shipped one's); what is watched here is the gateway."""
    return str(repository_with(None, tmp_path))


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    with LauncherRun("--repository", watch_repository(tmp_path_factory.mktemp("watch"))) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output
        yield run


@pytest.mark.server
def test_a_second_launch_on_the_same_gateway_port_refuses_naming_it(launch):
    t0 = time.monotonic()
    with LauncherRun(gateway_port=launch.gateway_port) as second:
        code = second.proc.wait(60)
        assert code == 1, second.output
        assert f"port {launch.gateway_port} (gateway) on 127.0.0.1 is already in use" in second.output
        assert "rose: serving" not in second.output and not second.processes()
    assert time.monotonic() - t0 < 30                         # refused before any model loaded
    assert embeds(launch)                                     # the first one is untouched


@pytest.mark.server
def test_a_killed_gateway_is_started_again_and_serves(launch):
    assert embeds(launch)
    old = gateway_pid(launch)
    folder = state_folder(old)
    seen = len(launch.lines)
    os.kill(old, signal.SIGKILL)
    assert launch.wait_for("starting it again (restart 1 of 3 within 60 s)", 30, after=seen), launch.output
    assert launch.wait_for("the gateway serves again", 60, after=seen), launch.output
    assert gateway_pid(launch) != old and embeds(launch)
    assert not folder.exists()                  # the killed one's worker state went with it
    assert launch.proc.poll() is None


@pytest.mark.server
def test_another_listener_on_the_gateway_port_stops_the_launch(launch):
    """The gateway's workers share their port through SO_REUSEPORT, so a second process that sets it
    can bind the port too and take some of its connections: the launch stops rather than let it."""
    seen = len(launch.lines)
    with socket.socket() as intruder:
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        intruder.bind(("127.0.0.1", launch.gateway_port))
        intruder.listen()
        code = launch.proc.wait(60)
    assert code == 1, launch.output
    assert f"another process now also listens on port {launch.gateway_port} (gateway)" in "".join(launch.lines[seen:])
    procs, segs = leftovers.wait_gone(launch.prefixes, 10.0)
    assert not procs and not segs, (procs, segs)


@pytest.mark.server
def test_a_gateway_that_keeps_dying_stops_everything(tmp_path):
    with LauncherRun("--repository", watch_repository(tmp_path)) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output
        folders = []
        for i in range(1, 4):
            seen = len(run.lines)
            folders.append(state_folder(gateway_pid(run)))
            os.kill(gateway_pid(run), signal.SIGKILL)
            assert run.wait_for(f"(restart {i} of 3 within 60 s)", 30, after=seen), run.output
            assert run.wait_for("the gateway serves again", 60, after=seen), run.output
        folders.append(state_folder(gateway_pid(run)))
        os.kill(gateway_pid(run), signal.SIGKILL)
        code = run.proc.wait(60)
        assert code == 1, run.output
        assert "4 exits within 60 s; stopping" in run.output
        assert not [f for f in folders if f.exists()]       # no killed gateway's worker state is left
        procs, segs = leftovers.wait_gone(run.prefixes, 10.0)
        assert not procs and not segs, (procs, segs)
