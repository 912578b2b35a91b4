"""The config.pbtxt parameters of the served models, parsed once into checked settings objects.

    settings = RoseSettings.from_model_config(args["model_config"])      # in initialize()
    settings.max_batch_tokens                                            # 16384 unless config.pbtxt says

Each dataclass below is the one place a model's parameters, types and defaults are written down;
model_repository/*/config.pbtxt spells the same defaults (tests/triton/test_settings.py checks
both). An unknown parameter, a wrong type or a value out of range is refused at start-up, naming
the model and the parameter. An empty string_value means "the default".
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from rose_backend.serving.memory import HostMemoryTrimmer
from rose_backend.serving.warmup import parse_precapture

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "fp8": ""}     # fp8: the default activations, FP8 GEMMs


class _Settings:
    MODEL = "?"
    MINIMUM: dict[str, int] = {}

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


@dataclass(frozen=True)
class RoseSettings(_Settings):
    """Parameters of `rose` (token ids -> embeddings), all optional:

    model_dir            Hugging Face folder (default "": $ROSE_MODEL_DIR, else the default model)
    model_kind           auto | embedding | cross-encoder | qwen3-reranker (default "": $ROSE_MODEL_KIND,
                         else detected from the folder, rose_backend/model_kind.py); a reranker
                         answers SCORES instead of EMBEDDINGS
    device               auto | cpu | cuda (default auto: the instance kind Triton assigns)
    dtype                float32 | bfloat16 | float16 | fp8 (default "": bfloat16 on GPU, float32 on CPU);
                         fp8: the default, with the layers' projections run as FP8 GEMMs (e4m3, per-channel
                         weight and per-token activation scales) for batches of at least fp8_min_tokens
                         tokens (layers/fp8.py); refused on a GPU without FP8 tensor cores
    fp8_min_tokens       the smallest batch, in tokens, that runs FP8 GEMMs under dtype=fp8 (default 0: the
                         crossover measured for the model's family, layers/fp8.py's MEASURED_MIN_TOKENS)
    attention            attention backend name (default "": the engine's choice per configuration)
    max_batch_tokens     token budget of one forward pass (default 16384)
    max_batch_seqs       sequence cap of one forward pass (default 64)
    max_inflight         batches launched but not yet collected (default 2)
    response_threads     threads that send finished requests' responses while the scheduler thread
                         goes on launching and collecting batches; a lone request with nothing else
                         waiting is still answered by the scheduler thread itself, and 0 answers
                         every request there, one after the other (default 4)
    host_memory_trim     idle | periodic | off: when the scheduler thread hands freed host heap back
                         to the OS (malloc_trim): idle = with nothing queued or in flight, at most
                         once a second (and every 30 s under a load that never pauses); periodic =
                         once a second whatever the load; off = never (default idle)
    precapture           "seqs:tokens,..." configurations warmed up in initialize() (kernels compiled,
                         CUDA graphs captured) before the model reports READY, or "none"; fitted to
                         the model's positions and the batch limits; other configurations are
                         captured lazily on their second sight (default "": on a GPU
                         warmup.DEFAULT_GPU_PRECAPTURE, single sequences of 64..512 tokens and
                         batches up to 16384 tokens; on the CPU one tiny batch)
    cuda_graphs          auto | on | off: off runs every batch eagerly (default auto: on for CUDA)
    gpu_memory_headroom_mb  after warm-up, cap this process's CUDA memory at what it holds plus this
                         many MiB, so bigger batches run out of memory and are split and retried: a
                         knob to force out-of-memory in tests and soaks, 0 = no cap (default 0)
    graph_memory_mb      cap on the CUDA-graph pool, MiB: once the captured graphs hold this much,
                         configurations not yet captured run eagerly (engine/graph_cache.py); the
                         `graphs` part of the memory budget; 0 = no cap (default 4096)
    memory_limit_mb      the memory budget (weights, graphs, workspace, buffers, activations:
                         engine/memory_budget.py) must fit in this many MiB or the model refuses to
                         start, naming each part; 0 = on a GPU its free memory less 1 GiB, on the
                         CPU no check (default 0)
    max_queued_tokens    tokens waiting in the pool before new requests are refused as
                         overloaded, 0 = unbounded; an interactive request counts only the
                         interactive tokens waiting, so bulk never shuts queries out (default 1048576)
    max_request_seqs     sequences per request (default 4096)
    max_request_tokens   tokens per request (default 1048576)
    drain_timeout_s      at unload (shutdown), seconds to finish admitted work before whatever is
                         left gets a "shutting down" error (default 20)
    inline_execute       auto | true | false: a request arriving while nothing is queued or running is
                         run inside execute() itself, with no hand-over to the scheduler thread
                         (default auto: on for a CUDA device; on the CPU the forward pass run on the
                         stub's main thread was up to 10x slower at 512 tokens, its OpenMP workers
                         contending, so auto leaves it off there)
    inline_backlog_us    such a request is also waited for and answered inside execute() unless it came
                         within this many us of execute() last returning (a backlog: the requests behind
                         it are batched); -1 = never (default 250; serving/service.py)
    quantization_ranges  .npy / .json file of [2, D] per-dimension min / max for ENCODING int8 and
                         uint8 (default "": quantization_ranges.npy / .json in the model folder, if any)
    bulk_threshold_tokens  a request that names no `lane` (request parameter: interactive | bulk) is
                         bulk when it carries more than this many tokens, else interactive
                         (default 8192; serving/lanes.py)
    bulk_min_share       share of a batch's tokens and sequences that bulk keeps while interactive
                         work waits beyond the batch, so bulk is never starved, 0..1 (default 0.25)
    bulk_batch_tokens    bulk tokens in one batch while interactive traffic is recent: what a query
                         waits behind (default 6144)
    bulk_max_inflight    batches holding bulk in flight while interactive traffic is recent; below
                         max_inflight, the other slots are kept for interactive batches (default 2)
    interactive_recent_ms  interactive traffic counts as recent for this long after the last
                         interactive request; with none for that long, bulk batches fill the whole
                         budget (default 1000)
    interactive_stream   off | on | auto (on with a GPU) (default off): interactive batches on a second
                         engine on the same weights, on a high-priority CUDA stream, beside the bulk
                         batches in flight (serving/query_lane.py); bulk batches then fill the budget
    """
    MODEL = "rose"
    MINIMUM = {"max_batch_tokens": 1, "max_batch_seqs": 1, "max_inflight": 1, "response_threads": 0,
               "max_queued_tokens": 0, "max_request_seqs": 1, "max_request_tokens": 1, "drain_timeout_s": 0,
               "gpu_memory_headroom_mb": 0, "graph_memory_mb": 0, "memory_limit_mb": 0,
               "bulk_threshold_tokens": 0, "bulk_batch_tokens": 1,
               "bulk_max_inflight": 1, "interactive_recent_ms": 0, "fp8_min_tokens": 0,
               "inline_backlog_us": -1}

    model_dir: str = ""
    model_kind: str = ""
    device: str = "auto"
    dtype: str = ""
    fp8_min_tokens: int = 0
    attention: str = ""
    max_batch_tokens: int = 16384        # graph_cache.BATCH_TOKENS / BATCH_SEQS, written out: this module is
    max_batch_seqs: int = 64             # imported by the tokenize stubs, which need no torch (test_settings.py)
    max_inflight: int = 2
    response_threads: int = 4
    host_memory_trim: str = "idle"
    precapture: str = ""
    max_queued_tokens: int = 1 << 20
    max_request_seqs: int = 4096
    max_request_tokens: int = 1 << 20
    drain_timeout_s: int = 20
    inline_execute: str = "auto"
    inline_backlog_us: int = 250
    cuda_graphs: str = "auto"
    gpu_memory_headroom_mb: int = 0
    graph_memory_mb: int = 4096
    memory_limit_mb: int = 0
    quantization_ranges: str = ""
    bulk_threshold_tokens: int = 8192
    bulk_min_share: float = 0.25
    bulk_batch_tokens: int = 6144
    bulk_max_inflight: int = 2
    interactive_recent_ms: int = 1000
    interactive_stream: str = "off"

    def __post_init__(self):
        self._check()
        if not 0.0 <= self.bulk_min_share <= 1.0:
            raise ValueError(f"model 'rose': parameter 'bulk_min_share' must be between 0 and 1, got {self.bulk_min_share}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"model 'rose': parameter 'device' must be auto, cpu or cuda, got {self.device!r}")
        if self.inline_execute not in ("auto", "true", "false"):
            raise ValueError(f"model 'rose': parameter 'inline_execute' must be auto, true or false, "
                             f"got {self.inline_execute!r}")
        if self.host_memory_trim not in HostMemoryTrimmer.MODES:
            raise ValueError(f"model 'rose': parameter 'host_memory_trim' must be one of "
                             f"{', '.join(HostMemoryTrimmer.MODES)}, got {self.host_memory_trim!r}")
        if self.interactive_stream not in ("auto", "on", "off"):
            raise ValueError(f"model 'rose': parameter 'interactive_stream' must be auto, on or off, "
                             f"got {self.interactive_stream!r}")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ValueError(f"model 'rose': parameter 'cuda_graphs' must be auto, on or off, got {self.cuda_graphs!r}")
        if self.dtype and self.dtype not in DTYPES:
            raise ValueError(f"model 'rose': parameter 'dtype' must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        self.precapture_configs       # parses, or says what is wrong

    def engine_limits(self, cfg) -> dict:
        """The engine's bucket limits for a model (ModelConfig) under these settings (graph_cache.bucket_limits)."""
        from rose_backend.engine.graph_cache import bucket_limits
        return bucket_limits(cfg.max_positions, self.max_batch_tokens, self.max_batch_seqs)

    def engine_fp8_min_tokens(self, cfg) -> int | None:
        """The engine's fp8_min_tokens for a model (ModelConfig): under dtype=fp8 the parameter, or
        where it is 0 the crossover measured for the model's family; else None (no FP8)."""
        if self.dtype != "fp8":
            return None
        from rose_backend.layers.fp8 import measured_min_tokens
        return self.fp8_min_tokens or measured_min_tokens(cfg)

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


@dataclass(frozen=True)
class TokenizeSettings(_Settings):
    """Parameters of `tokenize` (texts -> token ids), all optional:

    model_dir            Hugging Face folder (default "": $ROSE_MODEL_DIR, else the default model)
    model_kind           auto | embedding | cross-encoder | qwen3-reranker (default "": $ROSE_MODEL_KIND,
                         else detected from the folder); a reranker also tokenizes QUERY + DOCUMENTS pairs
    prompts              JSON {"name": "prefix"}, added to (or overriding) the prompts of the folder's
                         config_sentence_transformers.json (default "": the folder's own)
    fallback_prompts     JSON {"name": "prefix"} for prompt names the folder does not define itself
                         (default {"query": "", "passage": ""}: task="query" / "passage" run on
                         every model; a model without prompts, such as the default all-MiniLM-L6-v2,
                         which is symmetric, embeds the text as it is; a model with its own prompts,
                         such as Qwen3-Embedding's query instruction, keeps them)
    default_prompt_name  prompt used when a request names none (default "": the folder's, else none)
    max_seq_length       tokens kept per text, 0 = the model's (default 0)
    max_text_bytes       texts are cut to at most this many bytes before tokenizing (at the last
                         whitespace within 256 bytes of the limit when there is one), so a huge string
                         costs no more than a long one (default 65536)
    max_request_texts    texts (for pairs: documents) per request; more is refused with an error
                         naming the limit (default 4096)
    late_chunk_overlap   tokens shared by neighbouring windows of a late-chunked document longer than
                         the maximum length; -1: 64, at most a quarter of that length (default -1)
    batch_backlog_us     `tokenize_batched` (embed's tokenizer, which reads these parameters): a
                         request that comes less than this many microseconds after execute() last
                         returned is taken as part of a backlog, so its response is sent by the
                         worker and requests waiting meanwhile are encoded together; later ones are
                         answered inside execute(), with no thread hop (default 250)
    """
    MODEL = "tokenize"
    MINIMUM = {"max_seq_length": 0, "max_text_bytes": 0, "max_request_texts": 1, "batch_backlog_us": 0,
               "late_chunk_overlap": -1}

    model_dir: str = ""
    model_kind: str = ""
    prompts: str = ""
    fallback_prompts: str = '{"query": "", "passage": ""}'
    default_prompt_name: str = ""
    max_seq_length: int = 0
    max_text_bytes: int = 65536
    max_request_texts: int = 4096
    late_chunk_overlap: int = -1
    batch_backlog_us: int = 250

    def __post_init__(self):
        self._check()
        self.prompt_map               # parse, or say what is wrong
        self.fallback_prompt_map

    @property
    def overlap(self) -> int | None:
        """late_chunk_overlap as LateChunker takes it (None: its default)."""
        return None if self.late_chunk_overlap < 0 else self.late_chunk_overlap

    @property
    def prompt_map(self) -> dict[str, str]:
        return parse_prompts(self.prompts)

    @property
    def fallback_prompt_map(self) -> dict[str, str]:
        return parse_prompts(self.fallback_prompts, "fallback_prompts")


def parse_prompts(value: str, name: str = "prompts") -> dict[str, str]:
    """Deployment prompts from a config.pbtxt parameter: a JSON object {name: prefix}."""
    if not value.strip():
        return {}
    try:
        prompts = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"parameter {name!r} must be a JSON object of name -> prefix: {e}") from e
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"parameter {name!r} must be a JSON object mapping prompt names to prefix strings")
    return prompts


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
