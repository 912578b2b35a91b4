"""What a request hands a Python model of ours: its input tensors and its parameters, each read once."""
from __future__ import annotations

import json


def input_tensors(request) -> dict:
    """{name: pb_utils.Tensor} of a request's inputs, read once (pb_utils.get_input_tensor_by_name
    rebuilds the list of inputs on every call)."""
    return {t.name(): t for t in request.inputs()}


def request_parameters(request) -> dict:
    """A request's parameters as a dict (Triton hands them over as a JSON object; it forwards an
    ensemble's request parameters to its steps); {} when there are none or they do not parse."""
    raw = request.parameters()
    if not raw or raw == "{}":
        return {}
    try:
        params = json.loads(raw)
    except ValueError:
        return {}
    return params if isinstance(params, dict) else {}
