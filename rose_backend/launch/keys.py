"""The keys a deployment runs with, and the Triton options that require them.

- The API key (env API_KEY, or the first line of --api-key-file): what a caller who may infer needs
  on Triton (inference over gRPC; model metadata, model configuration, statistics over HTTP and
  gRPC) and on the gateway's /v1/*. None: all of it is open (perf_analyzer and Model Analyzer read a
  model's configuration and statistics; reading them changes nothing).
- The admin key (env ADMIN_KEY, else a fresh random one per start): Triton's control plane (model
  repository: load / unload; shared memory; trace; logging) and inference over Triton's HTTP port.
  It is always required: without it anyone who reaches Triton's ports could load a model whose
  model.py they send (a repository load with a file override), or crash the server with one HTTP
  body.

Both are checked with rose_client.auth.check_key (the form Triton's command line can carry) and
never printed. Triton takes them only on its command line; rose_backend.launch.argv_scrub hides them from
process listings once the server has read its options.
"""
from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from rose_backend import env_vars
from rose_client.auth import ADMIN_KEY_NAME, API_KEY_NAME, check_key, read_key_file

CONTROL_PLANE = ("model-repository", "shared-memory", "trace", "logging")
DATA_PLANE = ("inference", "metadata", "model-config", "statistics")
HTTP_ADMIN_ONLY = ("inference",)        # over HTTP under the admin key (restricted_args says why)
KEY_VARIABLES = ("API_KEY", "ADMIN_KEY", "ROSE_ADMIN_KEY")     # kept out of tritonserver's environment


@dataclass(frozen=True)
class Keys:
    api_key: str | None = field(default=None, repr=False)
    admin_key: str = field(default="", repr=False)


def key_from(env: dict | None, variable: env_vars.Variable) -> str | None:
    """The key in `variable` (of `env`; None: this process's environment), checked; surrounding
    whitespace (a Secret file's newline) is not part of it."""
    return check_key(variable.get(env).strip(), variable.name)


def admin_key_from(env: dict | None) -> str:
    """$ADMIN_KEY (checked), else a fresh random key."""
    return key_from(env, env_vars.ADMIN_KEY) or secrets.token_urlsafe(32)


def launch_keys(env: dict | None, api_key_file: str | None = None) -> Keys:
    """The launch's keys from its environment (and key file); ValueError naming what is wrong."""
    if api_key_file:
        api_key = check_key(read_key_file(api_key_file), f"the key in --api-key-file {api_key_file}")
    else:
        api_key = key_from(env, env_vars.API_KEY)
    return Keys(api_key, admin_key_from(env))


def restricted_args(api_key: str | None, admin_key: str) -> list[str]:
    """tritonserver options: the control plane under the admin key, the data plane (inference,
    metadata, model config, statistics) under the API key when there is one. Inference over HTTP is
    under the admin key too, whatever the API key: callers infer through gRPC and the gateway, and
    Triton's HTTP server parses a JSON body recursively (a deeply nested one crashes it), while a
    restricted call is refused before its body is read. Health stays open (probes, readiness)."""
    args = []
    http = {ADMIN_KEY_NAME: CONTROL_PLANE + HTTP_ADMIN_ONLY, API_KEY_NAME: tuple(
        a for a in DATA_PLANE if a not in HTTP_ADMIN_ONLY)}
    for plane, name, value in ((CONTROL_PLANE, ADMIN_KEY_NAME, admin_key), (DATA_PLANE, API_KEY_NAME, api_key)):
        if value:
            args += [f"--http-restricted-api={','.join(http[name])}:{name}={value}",
                     f"--grpc-restricted-protocol={','.join(plane)}:{name}={value}"]
    return args


def is_loopback(address: str) -> bool:
    """127.x, ::1 or localhost: reachable from this machine only."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(address: str, api_key: str | None) -> str | None:
    """The warning for a launch that serves other hosts without an API key (None: nothing to say)."""
    if api_key or is_loopback(address):
        return None
    return (f"rose: WARNING: serving on {address} without an API key: anyone who reaches these ports can "
            f"embed (gRPC, HTTP gateway) and read the models' metadata, configuration and statistics. Set API_KEY (or --api-key-file) to "
            f"require a key, or bind 127.0.0.1")
