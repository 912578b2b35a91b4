"""The request-path figure (docs/images/request-path.png): a request from the client to the answer.

Drawn from the repository, so that it stays true: the `embed` ensemble's steps are read from
model_repository/embed/config.pbtxt, and every box names the source file that does its part; a
file gone (renamed, removed) stops the drawing with its name.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEP = re.compile(r'model_name:\s*"([^"]+)"')
# a step of the `embed` ensemble before `rose` -> (what it does, its source)
STEP_PARTS = {"tokenize_batched": ("Rust tokenizers: the texts\nwaiting are encoded together",
                                   "ensemble/rose_ensemble/tokenize_batcher.py"),
              "tokenize": ("Rust tokenizers, one request\nat a time", "ensemble/rose_ensemble/triton_tokenize.py")}
GRPC, HTTP, ROSE = "#2980b9", "#27ae60", "#c0392b"


def ensemble_steps(repository: Path = ROOT / "model_repository") -> list[str]:
    """The `embed` ensemble's steps in order, from its config."""
    steps = STEP.findall((repository / "embed" / "config.pbtxt").read_text())
    if not steps or steps[-1] != "rose":
        raise ValueError(f"{repository / 'embed' / 'config.pbtxt'}: steps {steps}, expected a last step `rose`")
    return steps


def boxes(repository: Path = ROOT / "model_repository") -> dict[str, tuple[tuple[float, float, float, float], str, str, str, str]]:
    """name -> ((x, y, width, height), title, what it does, source, colour); the canvas is 100 x 46."""
    out = {
        "grpc": ((1, 29, 13, 11), "gRPC client", "rose_client, tritonclient:\ntexts to embed,\ntoken ids to rose",
                 "client/rose_client/client.py", GRPC),
        "http": ((1, 6, 13, 11), "HTTP client", "OpenAI /v1/embeddings,\n/v1/rerank; TEI /embed", "", HTTP),
        "gateway": ((18, 6, 13, 11), "rose gateway", "tokenizes the texts,\nsends token ids", "gateway/rose_gateway/app.py",
                    HTTP),
        "triton": ((36, 6, 11, 34), "tritonserver", "gRPC streams;\na Python\nbackend stub\nper model\ninstance",
                   "model_repository/", "#7f8c8d"),
    }
    before_rose = ensemble_steps(repository)[:-1]
    width = 19 / max(len(before_rose), 1)
    for i, step in enumerate(before_rose):
        what, source = STEP_PARTS.get(step, ("", f"model_repository/{step}/config.pbtxt"))
        out[f"step:{step}"] = ((52.5 + i * width, 33, width - 1, 7), step, what, source, GRPC)
    out.update({
        "scheduler": ((74, 29, 25, 11), "rose: scheduler", "ragged batches to a token\nbudget; query and bulk lanes",
                      "rose_backend/serving/scheduler.py", ROSE),
        "engine": ((74, 17.5, 25, 9), "rose: engine", "packed (tokens, hidden) forward;\nCUDA graphs per bucket",
                   "rose_backend/engine/graph_cache.py", ROSE),
        "answer": ((74, 6, 25, 9), "answer", "pooled rows, sent back\non the request's stream", "rose_backend/serving/responders.py",
                   ROSE),
    })
    return out


def arrows(repository: Path = ROOT / "model_repository") -> list[tuple[str, str, str, float | None]]:
    """(from, to, label, height of a rightward arrow; None: downwards) in the order a request takes them."""
    chain = ["triton", *(f"step:{s}" for s in ensemble_steps(repository)[:-1]), "scheduler"]
    return ([("grpc", "triton", "gRPC", 34.5), ("http", "gateway", "HTTP", 11.5), ("gateway", "triton", "ids", 11.5)]
            + [(a, b, "embed" if a == "triton" else "ids" if b == "scheduler" else "", 36.5)
               for a, b in zip(chain, chain[1:])]
            + [("triton", "scheduler", "rose: token ids", 31), ("scheduler", "engine", "", None), ("engine", "answer", "", None)])


def draw(path: Path, repository: Path = ROOT / "model_repository") -> list[str]:
    """Draw the figure into `path` (PNG); returns the box titles drawn, left to right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    parts = boxes(repository)
    missing = [source for *_, source, _ in parts.values() if source and not (ROOT / source).exists()]
    if missing:
        raise FileNotFoundError(f"the request path names files that are gone: {missing} (update rose_bench/request_path.py)")
    fig, ax = plt.subplots(figsize=(11, 4.8), dpi=100)
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 46)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((34.5, 4.5), 65.3, 38, boxstyle="round,pad=0.3", facecolor="#f4f6f7",
                                edgecolor="#bdc3c7", linestyle="--"))
    ax.text(35.5, 43, f"one tritonserver: model_repository/ (embed = {' -> '.join(ensemble_steps(repository))})",
            fontsize=7, color="0.4", va="bottom")
    for (x, y, w, h), title, what, source, colour in parts.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.4", facecolor="white", edgecolor=colour,
                                    linewidth=1.6))
        ax.text(x + w / 2, y + h - 0.9, title, ha="center", va="top", fontsize=8.5, weight="bold", color=colour)
        ax.text(x + w / 2, y + h / 2 - 0.4, what, ha="center", va="center", fontsize=7)
        if source:
            ax.text(x + w / 2, y + 0.4, source, ha="center", va="bottom", fontsize=5, color="0.45", family="monospace")
    for a, b, label, height in arrows(repository):
        (ax_, ay, aw, ah), (bx, by, bw, bh) = parts[a][0], parts[b][0]
        if height is None:
            start, end = (ax_ + aw / 2, ay - 0.5), (bx + bw / 2, by + bh + 0.5)
        else:
            start, end = (ax_ + aw + 0.5, height), (bx - 0.5, height)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="0.25", linewidth=1.2))
        if label:
            ax.text((start[0] + end[0]) / 2, height + 0.4, label, ha="center", va="bottom", fontsize=6.5)
    ax.plot([86.5, 86.5, 7.5], [5.2, 2.6, 2.6], color=ROSE, linestyle=":", linewidth=1.2)
    ax.add_patch(FancyArrowPatch((7.5, 2.6), (7.5, 5.3), arrowstyle="-|>", mutation_scale=10, color=ROSE, linewidth=1.2))
    ax.text(47, 0.4, "the answer goes back the way the request came: the gRPC stream, or the gateway's HTTP response",
            fontsize=6.5, color=ROSE, ha="center", va="bottom")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return [title for _, title, *_ in sorted(parts.values(), key=lambda p: (p[0][0], -p[0][1]))]
