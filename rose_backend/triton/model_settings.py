"""The config.pbtxt parameters of `rose`, parsed once into a checked settings object, and the base
of every model's settings (`tokenize`'s: rose_ensemble/tokenize_settings.py).

    settings = RoseSettings.from_model_config(args["model_config"])      # in initialize()
    settings.max_batch_tokens                                            # BATCH_TOKENS unless config.pbtxt says

Each settings dataclass is the one place a model's parameters, types and defaults are written down in
code; docs/OPERATIONS.md says what each means, and it and model_repository/*/config.pbtxt state the
same defaults (tests/triton/test_settings.py checks both). An unknown parameter, a wrong type or a value out of range is refused at start-up, naming
the model and the parameter. An empty string_value means "the default".
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from rose_backend.serving.lanes import parse_bulk_batch_ms
from rose_backend.serving.memory import HostMemoryTrimmer
from rose_backend.serving.service_settings import ServiceSettings as _S
from rose_backend.serving.warmup import parse_precapture

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "fp8": ""}     # fp8: the default activations, FP8 GEMMs


class ModelSettings:
    """The base of a model's settings: from_model_config() / from_values() parse, refuse unknown
    parameters and wrong types; MINIMUM: lower bounds and CHOICES: the values a parameter takes, both
    checked by _check()."""
    MODEL = "?"
    MINIMUM: dict[str, int] = {}
    CHOICES: dict[str, tuple[str, ...]] = {}

    @classmethod
    def from_model_config(cls, model_config: str | dict):
        """Parse Triton's model configuration (the JSON initialize() gets, or its dict)."""
        cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
        values = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        return cls.from_values(values)

    @classmethod
    def from_values(cls, values: dict[str, str]):
        """From {parameter: string value}; empty values keep the default."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"model {cls.MODEL!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(fields)} ({cls.__module__}.{cls.__name__})")
        kwargs = {}
        for name, raw in values.items():
            raw = raw.strip()
            if raw:
                kwargs[name] = cls._convert(name, raw, fields[name].default)
        return cls(**kwargs)

    @classmethod
    def _convert(cls, name: str, raw: str, default):
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"model {cls.MODEL!r}: parameter {name!r} must be true or false, got {raw!r}")
        if isinstance(default, int):
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"model {cls.MODEL!r}: parameter {name!r} must be an integer, got {raw!r}") from None
        if isinstance(default, float):
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"model {cls.MODEL!r}: parameter {name!r} must be a number, got {raw!r}") from None
        return raw

    def _check(self) -> None:
        for name, minimum in self.MINIMUM.items():
            value = getattr(self, name)
            if value < minimum:
                raise ValueError(f"model {self.MODEL!r}: parameter {name!r} must be >= {minimum}, got {value}")
        for name, choices in self.CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"model {self.MODEL!r}: parameter {name!r} must be {', '.join(choices[:-1])} "
                                 f"or {choices[-1]}, got {value!r}")


@dataclass(frozen=True)
class RoseSettings(ModelSettings):
    """Parameters of `rose` (token ids -> embeddings), all optional: their meanings are
    docs/OPERATIONS.md's tables, their types and defaults the fields below (the service's own from
    ServiceSettings, `_S`)."""
    MODEL = "rose"
    MINIMUM = {"max_batch_tokens": 1, "max_batch_seqs": 1, "max_inflight": 1, "response_threads": 0,
               "max_queued_tokens": 0, "max_request_seqs": 1, "max_request_tokens": 1, "drain_timeout_s": 0,
               "gpu_memory_headroom_mb": 0, "graph_memory_mb": 0, "memory_limit_mb": 0,
               "bulk_threshold_tokens": 0, "bulk_batch_tokens": 1,
               "bulk_max_inflight": 1, "interactive_recent_ms": 0, "fp8_min_tokens": 0,
               "inline_backlog_us": -1}
    CHOICES = {"device": ("auto", "cpu", "cuda"), "inline_execute": ("auto", "true", "false"),
               "interactive_stream": ("auto", "on", "off"), "cuda_graphs": ("auto", "on", "off")}

    model_dir: str = ""
    model_kind: str = ""
    trust_remote_code: str = ""
    device: str = "auto"
    dtype: str = ""
    fp8_min_tokens: int = 0
    attention: str = ""
    max_batch_tokens: int = _S.max_batch_tokens
    max_batch_seqs: int = _S.max_batch_seqs
    max_inflight: int = _S.max_inflight
    response_threads: int = _S.response_threads
    host_memory_trim: str = _S.host_memory_trim
    precapture: str = ""
    max_queued_tokens: int = _S.max_queued_tokens
    max_request_seqs: int = 4096
    max_request_tokens: int = 1 << 20
    drain_timeout_s: int = 20
    inline_execute: str = "auto"
    inline_backlog_us: int = _S.backlog_us
    cuda_graphs: str = "auto"
    gpu_memory_headroom_mb: int = 0
    graph_memory_mb: int = 4096
    memory_limit_mb: int = 0
    quantization_ranges: str = ""
    bulk_threshold_tokens: int = _S.bulk_threshold_tokens
    bulk_min_share: float = _S.bulk_min_share
    bulk_batch_tokens: int = _S.bulk_batch_tokens
    bulk_max_inflight: int = _S.bulk_max_inflight
    interactive_recent_ms: int = _S.interactive_recent_ms
    interactive_stream: str = "auto"
    bulk_batch_ms: str = _S.bulk_batch_ms

    def __post_init__(self):
        self._check()
        if not 0.0 <= self.bulk_min_share <= 1.0:
            raise ValueError(f"model 'rose': parameter 'bulk_min_share' must be between 0 and 1, got {self.bulk_min_share}")
        if self.host_memory_trim not in HostMemoryTrimmer.MODES:
            raise ValueError(f"model 'rose': parameter 'host_memory_trim' must be one of "
                             f"{', '.join(HostMemoryTrimmer.MODES)}, got {self.host_memory_trim!r}")
        parse_bulk_batch_ms(self.bulk_batch_ms)
        if self.trust_remote_code.lower() not in ("", "true", "false"):
            raise ValueError(f"model 'rose': parameter 'trust_remote_code' must be true, false or empty "
                             f"($ROSE_TRUST_REMOTE_CODE), got {self.trust_remote_code!r}")
        if self.dtype and self.dtype not in DTYPES:
            raise ValueError(f"model 'rose': parameter 'dtype' must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        self.precapture_configs       # parses, or says what is wrong

    def engine_limits(self, cfg) -> dict:
        """The engine's bucket limits for a model (ModelConfig) under these settings (graph_cache.bucket_limits)."""
        from rose_backend.engine.graph_cache import bucket_limits
        return bucket_limits(cfg.max_positions, self.max_batch_tokens, self.max_batch_seqs)

    def engine_fp8_min_tokens(self, cfg) -> int | None:
        """The engine's fp8_min_tokens for a model (ModelConfig): under dtype=fp8 the parameter, or
        where it is 0 the default crossover of the model's family (layers/fp8.py); else None (no FP8)."""
        if self.dtype != "fp8":
            return None
        from rose_backend.layers.fp8 import default_min_tokens
        return self.fp8_min_tokens or default_min_tokens(cfg)

    @property
    def torch_dtype_name(self) -> str | None:
        """"float32" / "bfloat16" / "float16", or None for the engine's default."""
        return DTYPES.get(self.dtype) or None

    @property
    def precapture_configs(self) -> list[tuple[int, int]]:
        """`precapture` as [(seqs, tokens), ...] ([] for "" and "none"; see warmup.precapture_plan)."""
        return parse_precapture(self.precapture)

    @property
    def graphs(self) -> bool | None:
        """`cuda_graphs` for the Engine: None (its default), True or False."""
        return None if self.cuda_graphs == "auto" else self.cuda_graphs == "on"


def read_model_config(path):
    """A config.pbtxt as Triton reads it: protobuf text format into tritonclient's ModelConfig message."""
    from google.protobuf import text_format      # tritonclient's dependency
    from tritonclient.grpc import model_config_pb2
    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


def model_config_file(path) -> dict:
    """Another model's config.pbtxt as the dict Triton hands initialize() (args["model_config"]):
    for a model that takes its parameters from a sibling's (the batching `tokenize_batched` reads
    `tokenize`'s, so a deployment sets prompts and limits in one place)."""
    from google.protobuf import json_format
    return json_format.MessageToDict(read_model_config(path), preserving_proto_field_name=True)


def edit_model_config(path, *, name: str | None = None, parameters: dict | None = None,
                      step_models: dict[str, str] | None = None, change=None) -> None:
    """Rewrite a config.pbtxt (the one writer of them): the model's `name`, string `parameters`
    replaced or added, an ensemble's steps renamed ({old model name: new}), then `change(message)`
    for anything else (e.g. an instance count). Written back in protobuf text format (comments are
    not kept: for repository copies, not the shipped files)."""
    from google.protobuf import text_format
    message = read_model_config(path)
    if name is not None:
        message.name = name
    for key, value in (parameters or {}).items():
        message.parameters[key].string_value = str(value)
    for step in message.ensemble_scheduling.step:
        step.model_name = (step_models or {}).get(step.model_name, step.model_name)
    if change is not None:
        change(message)
    Path(path).write_text(text_format.MessageToString(message))
