"""Every environment variable the server side reads (the launcher, the models inside Triton, the
gateway), with its default and one line; docs/ENVIRONMENT.md is the same table for operators. Code
reads a variable only through its entry here:

    from rose_backend import env_vars
    env_vars.ROSE_MODEL_DIR.get()                  # the value, or the default where it is unset or empty
    env_vars.ROSE_FLASHINFER_WORKSPACE_MB.integer()    # ValueError naming the variable where it is no integer
    env_vars.ROSE_MODEL_DIR.get(env)               # from another mapping (a child's environment)

The served settings are the models' config.pbtxt parameters and the launcher's and the gateway's
options (`make serve` passes its variables as options). These are the few that are neither: the
keys, where things live on the host, three engine settings for hosts that need them, what the
launcher and the gateway set for their own children, and other tools' variables the product reads
too. The client (client/rose_client, which never imports rose_backend) reads its two through
rose_client/env_vars.py; VARIABLES holds them too. Writing an environment for a child process is
not reading. Each model.py reads ROSE_PYTHONPATH itself, as the first thing it does, when no part
of this package can be imported yet (triton/stub_path.py).
"""
from __future__ import annotations

from rose_client.env_vars import API_KEY, ROSE_URL, TRUE, Variable
from rose_client.env_vars import VARIABLES as CLIENT_VARIABLES

# The launcher (`python -m rose_backend.launch`, `make serve`) and the gateway
API_KEY_FILE = Variable("API_KEY_FILE", "", "a file whose first line is the API key (--api-key-file; instead of API_KEY)")
ADMIN_KEY = Variable("ADMIN_KEY", "", "Triton's control-plane key (empty: a random key per start)")
GATEWAY_WORKERS = Variable("GATEWAY_WORKERS", "", "gateway processes sharing its port (--workers; empty: the "
                           "cores this process may use)")

# Where things live on the host
ROSE_CACHE_DIR = Variable("ROSE_CACHE_DIR", "", "the persistent compile caches (flashinfer, Triton-language "
                          "kernels, inductor, CUDA's PTX) (empty: $XDG_CACHE_HOME/rose, else ~/.cache/rose)")
TRITONSERVER_BIN = Variable("TRITONSERVER_BIN", "", "the tritonserver binary (empty: tritonserver on PATH, else "
                            "the nvidia-pytriton wheel's)")
TRITON_BACKEND_DIR = Variable("TRITON_BACKEND_DIR", "", "Triton's backend folder for TRITONSERVER_BIN (empty: "
                              "beside the binary, else its built-in default)")
ROSE_STUB_SITE = Variable("ROSE_STUB_SITE", "", "a folder of packages the Python backend's stub imports first: "
                          "numpy<2 where the interpreter has numpy 2 (pip install --target DIR numpy==1.26.4)")
ROSE_ALLOW_NUMPY2 = Variable("ROSE_ALLOW_NUMPY2", "", "1: the models start with numpy 2 in the stub (a Python "
                             "backend built for numpy 2); otherwise they refuse it")

# Inside the server (the models), beside the config.pbtxt parameters
ROSE_MODEL_DIR = Variable("ROSE_MODEL_DIR", "", "the model folder where a model's model_dir parameter is empty "
                          "(the launcher sets it from --model; empty: the default model)")
ROSE_MODEL_KIND = Variable("ROSE_MODEL_KIND", "", "the kind where a model's model_kind parameter is empty "
                           "(the launcher sets it from --kind; empty: detected from the folder)")
ROSE_TRUST_REMOTE_CODE = Variable("ROSE_TRUST_REMOTE_CODE", "", "1: `rose` runs a folder's own modeling code where "
                                  "its trust_remote_code parameter is empty (the launcher sets it from "
                                  "--trust-remote-code)")
ROSE_ATTENTION_EXCLUDE = Variable("ROSE_ATTENTION_EXCLUDE", "", "comma-separated attention backends never chosen "
                                  "(torch_varlen, flashinfer, flashinfer_fa3, flash_attn4, sdpa_loop): for a host "
                                  "where one misbehaves; read at each choice")
ROSE_FLASHINFER_WORKSPACE_MB = Variable("ROSE_FLASHINFER_WORKSPACE_MB", "512", "flashinfer's float workspace per "
                                        "backend in MiB; its largest batch is 8192 tokens per 256 MiB (raise it "
                                        "with max_batch_tokens past 16384); read at import")
ROSE_MAIN_ENGINE_SMS = Variable("ROSE_MAIN_ENGINE_SMS", "0", "the main engine's kernels on a CUDA green context "
                                "of this many SMs, the rest kept for the query lane (faster queries beside bulk, "
                                "less bulk throughput); 0: the whole device; read when an engine is built")
ROSE_STAGE_TIMES = Variable("ROSE_STAGE_TIMES", "", "a folder: `rose`, the tokenize models and the gateway time "
                            "each request's host stages and write their summaries there (empty: off)")

# Set by the launcher or the gateway for their own children, not by operators
ROSE_PYTHONPATH = Variable("ROSE_PYTHONPATH", "", "the launcher's import paths for the Python backend's stub, "
                           "which ignores PYTHONPATH (each model.py reads it)")
ROSE_RERANKER_DIR = Variable("ROSE_RERANKER_DIR", "", "the reranker folder of a server that serves one beside an "
                             "embedding model (its models' model_dir names it)")
ROSE_SERVER_RESTARTS = Variable("ROSE_SERVER_RESTARTS", "0", "times the launcher restarted this server "
                                "(rose_server_restarts_total)")
ROSE_GATEWAY_WORKER = Variable("ROSE_GATEWAY_WORKER", "", "i/n: this gateway process is worker i of n")
PROMETHEUS_MULTIPROC_DIR = Variable("PROMETHEUS_MULTIPROC_DIR", "", "the gateway workers' shared folder: their "
                                    "metrics (prometheus_client's variable) and serving marks")

# Other tools' own
MAKELEVEL = Variable("MAKELEVEL", "", "set by make: the launcher then stops its servers when its parent dies "
                     "(--die-with-parent)")
XDG_CACHE_HOME = Variable("XDG_CACHE_HOME", "", "the user's cache folder (empty: ~/.cache): ROSE_CACHE_DIR's "
                          "default, and a private copy of a read-only Triton backend folder")
HF_HUB_CACHE = Variable("HF_HUB_CACHE", "", "the Hugging Face cache, where a model id's error message looks "
                        "for a downloaded copy (empty: $HF_HOME/hub)")
HF_HOME = Variable("HF_HOME", "~/.cache/huggingface", "the Hugging Face home (HF_HUB_CACHE's default)")
PATH = Variable("PATH", "", "where the launcher looks for tritonserver (after TRITONSERVER_BIN)")
PYTHONPATH = Variable("PYTHONPATH", "", "kept, after the project's own paths, for the Python backend's stub and "
                      "the gateway")
LD_LIBRARY_PATH = Variable("LD_LIBRARY_PATH", "", "kept, after this interpreter's libpython, for tritonserver")
TRITON_INTERPRET = Variable("TRITON_INTERPRET", "", "1: Triton-language kernels run in Triton's interpreter "
                            "(the CPU tests); they then launch without programmatic dependent launch")

VARIABLES = CLIENT_VARIABLES + tuple(v for v in globals().values()
                                     if isinstance(v, Variable) and v not in CLIENT_VARIABLES)
__all__ = ["API_KEY", "ROSE_URL", "TRUE", "VARIABLES", "Variable"] + [v.name for v in VARIABLES if v.name not in
                                                             ("API_KEY", "ROSE_URL")]
