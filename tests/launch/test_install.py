"""The documented install in a fresh virtual environment: `pip install .` from a checkout
installs what the server imports (the client included), and the launcher started with that
environment's Python serves. The environment takes the third-party
packages (torch, tritonserver, ...) from this one's site-packages through a path file, so that only
the project is installed (seconds): what is checked is what it ships and declares, not PyPI."""
from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support.launcher import LauncherRun

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    py = env / "bin" / "python"
    own = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    # this environment's packages, as plain paths: its .pth files (the editable installs of the project
    # itself) are not read there, so the project's own code comes only from what is installed below
    Path(own, "third_party.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # ensurepip's setuptools is older than the one the project builds with (this environment's)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, capture_output=True)
    return py


def pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_the_documented_install_holds_what_the_server_imports_and_serves(fresh):
    installed = pip(fresh, ".")
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    # the server, the gateway and the client they import all come from the fresh environment
    check = subprocess.run([str(fresh), "-c", "import rose_client, rose_backend.launch.keys, rose_gateway.app; "
                            "print(rose_client.__file__, rose_backend.__file__, rose_gateway.__file__)"],
                           cwd="/", capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and check.stdout.count(str(fresh.parent.parent)) == 3, check.stdout + check.stderr
    assert (fresh.parent / "rose-embed").exists()
    with LauncherRun(python=str(fresh)) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output[-3000:]
        import httpx
        r = httpx.post(run.gateway_url + "/v1/embeddings", json={"input": ["served from a fresh environment"]},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384, r.text
