"""What the launcher prints once it serves: where, and a command that works as printed (with the
deployment's API key read where the user keeps it, never the key itself)."""
from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

from rose_backend.launch.deployment import REPO_ROOT


def key_expression(api_key_file: str | None) -> str:
    """Python code that reads the deployment's API key as the user holds it."""
    if api_key_file:
        return f"open({str(Path(api_key_file).resolve())!r}).readline().strip()"
    return 'os.environ["API_KEY"]'


def client_command(urls: str, call: str = 'embed(["hello world"]).shape', keyed: bool = False,
                   api_key_file: str | None = None) -> str:
    """A shell command that embeds one text (or makes another client `call`) through these servers,
    with this interpreter's full path (it works from any shell), or how to install rose_client first
    where this interpreter lacks it. keyed: the deployment requires an API key, read from $API_KEY."""
    key = f", api_key={key_expression(api_key_file)}" if keyed else ""
    code = (("import os; " if keyed and not api_key_file else "")
            + f'from rose_client import EmbeddingClient; print(EmbeddingClient("{urls}"{key}).{call})')
    if importlib.util.find_spec("rose_client") is None:
        return f"pip install {shlex.quote(str(REPO_ROOT / 'client'))}  &&  python -c {shlex.quote(code)}"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def banner(model_dir: str, urls: str, seconds: float, models: tuple[str, ...], metrics_url: str,
           gateway_url: str | None, keyed: bool, api_key_file: str | None, reranker_dir: str | None = None) -> str:
    """models: those served; reranker_dir: the reranker folder served beside model_dir, if any."""
    embeds, reranks = "embed" in models, "rerank" in models
    served = ", ".join([*(["embed (text)"] if embeds else []), *(["rerank (query, documents)"] if reranks else []),
                        "tokenize", "rose (token ids)", *(["rerank_tokenize", "rerank_rose"] if reranker_dir else [])])
    folders = f"{model_dir} and the reranker {reranker_dir}" if reranker_dir else model_dir
    calls = (['embed(["hello world"]).shape'] if embeds else []) + \
        (['rerank("what is rose?", ["a flower", "a server"])'] if reranks else [])
    lines = [f"\nrose: serving {folders} on {urls} (gRPC), ready in {seconds:.1f} s. Models: {served}."
             + (" An API key is required." if keyed else ""),
             *(f"  {client_command(urls, call, keyed, api_key_file)}" for call in calls),
             f"  metrics: {metrics_url}   Ctrl-C stops."]
    if gateway_url:
        bearer = "  (header Authorization: Bearer <the API key>)" if keyed else ""
        routes = "   ".join([*([f"{gateway_url}/v1/embeddings"] if embeds else []),
                             *([f"{gateway_url}/v1/rerank"] if reranks else [])])
        lines.append(f"  HTTP (OpenAI-compatible): {routes}{bearer}")
    return "\n".join(lines) + "\n"
