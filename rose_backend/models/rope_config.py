"""RoPE settings of a config.json, in transformers 5's spelling (`rope_parameters`, flat or nested by
layer type) and 4's (`rope_theta` or a family's own key, `rope_scaling`), for the families' readers.

    rope = rope_parameters(raw, default_theta=10_000.0)                    # Llama, Mistral, Qwen2
    local = rope_parameters(raw, "sliding_attention", "rope_local_base_freq", 10_000.0, scaled=False)
    RotaryEmbedding(head_dim, max_positions, rope["rope_theta"], rope)     # layers/rotary.py
"""
from __future__ import annotations

# keys of a layer type's entry when rope_parameters is nested by layer type
LAYER_TYPES = ("full_attention", "sliding_attention")


def rope_parameters(raw: dict, layer_type: str | None = None, theta_key: str = "rope_theta",
                    default_theta: float = 10_000.0, scaled: bool = True) -> dict:
    """{"rope_type", "rope_theta", and the scaling keys}: config.json's rope_parameters (the entry of
    `layer_type` where it is nested by layer type), else raw[theta_key] with rope_scaling (when `scaled`:
    4.x configs scale the layers that read rope_theta), else `default_theta` unscaled."""
    params = raw.get("rope_parameters") or {}
    if any(k in params for k in LAYER_TYPES):
        params = params.get(layer_type or "full_attention") or {}
    out = dict(params)
    if not out and scaled and raw.get("rope_scaling"):
        out = dict(raw["rope_scaling"])
    out["rope_type"] = out.get("rope_type", out.pop("type", "default"))
    if out.get("rope_theta") is None:
        out["rope_theta"] = raw.get(theta_key) or default_theta
    if out["rope_type"] == "llama3" and "original_max_position_embeddings" not in out:
        out["original_max_position_embeddings"] = (raw.get("original_max_position_embeddings")
                                                   or raw.get("max_position_embeddings"))
    return out
