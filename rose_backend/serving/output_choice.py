"""Which outputs a request is sent: the names it gives Triton, and the request parameter `outputs`.

A request names its outputs (Triton's requested outputs) and gets exactly those, or an error naming
the one it cannot have; nothing named is ever left out of the answer. What Triton hands a Python
model (Triton 2.51; tests/server/test_requested_outputs.py checks it):
  - a request naming no outputs arrives naming every output the model declares;
  - a request naming an output the model does not declare is refused by Triton itself (INVALID_ARG
    "unexpected inference output 'X' for model 'Y'"), before any model sees it;
  - an ensemble's step is asked for every output its output_map maps, whatever the client named,
    and neither the step's request nor its parameters carry the client's names; an output the
    client named but the step did not send is then simply absent from the answer. So the `embed`
    ensemble declares only EMBEDDINGS, and the multi-output requests go to `encode`, a model that
    sees the names (ensemble/rose_ensemble/triton_encode.py).

choose_outputs(requested, parameter, declared, none_means):
  - a request that names none of its outputs (it arrives naming all of `declared`) gets
    `none_means`, unless the parameter `outputs` is given: then EMBEDDINGS and the parameter's kinds;
  - a request that names outputs gets those; a named output the model cannot send (SCORES of an
    embedding model) is refused, and so is a parameter that contradicts the names: a named output
    the parameter leaves out, or a kind the parameter asks for with none of its outputs named (what
    a request through `embed` asking for sparse by parameter is: its outputs cannot be named there).
The parameter (comma-separated "sparse", "colbert", "token_counts", "truncated"; "" or "dense" for
the dense rows only) is for callers that cannot name outputs; naming them is enough everywhere else.
"""
from __future__ import annotations

SPARSE_OUTPUTS = ("SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS")
COLBERT_OUTPUTS = ("COLBERT", "COLBERT_LENS")
COUNT_OUTPUTS = ("TOKEN_COUNTS", "TRUNCATED")
KIND_OF = {**{n: "sparse" for n in SPARSE_OUTPUTS}, **{n: "colbert" for n in COLBERT_OUTPUTS},
           "TOKEN_COUNTS": "token_counts", "TRUNCATED": "truncated"}
ENGINE_KINDS = frozenset({"sparse", "colbert"})          # kinds the engine computes (BGE-M3's heads)
ALL_OUTPUTS = frozenset({"EMBEDDINGS", *KIND_OF})         # an embedding model's outputs
DENSE = frozenset({"EMBEDDINGS"})
PARAMETER_KINDS = ("sparse", "colbert", "token_counts", "truncated")
ENCODE_HINT = "the `embed` ensemble sends EMBEDDINGS only: name the others on the `encode` model"


def parameter_kinds(parameter: str) -> frozenset:
    """The kinds the request parameter `outputs` asks for; ValueError naming what it does not know."""
    kinds = frozenset(k.strip().lower() for k in str(parameter).split(",") if k.strip())
    bad = kinds - {"dense", *PARAMETER_KINDS}
    if bad:
        raise ValueError(f"request parameter 'outputs' takes {', '.join(PARAMETER_KINDS)} (comma-separated); "
                         f"got {sorted(bad)}")
    return kinds - {"dense"}


def named_none(requested, declared) -> bool:
    """Whether a request named no outputs (Triton then hands over every declared one)."""
    requested = frozenset(requested)
    return not requested or requested >= frozenset(declared)


def dense_only(requested, declared) -> bool:
    """Whether a request without parameters gets EMBEDDINGS alone: it named none, or only it."""
    requested = frozenset(requested)
    return requested == DENSE or named_none(requested, declared)


def choose_outputs(requested, parameter: str | None, declared=ALL_OUTPUTS,
                   none_means: frozenset = DENSE) -> tuple[frozenset, frozenset]:
    """(names to send, token outputs the engine computes); see the module docstring for the rule.
    ValueError naming each output that was asked for and would not be sent."""
    requested = frozenset(requested)
    kinds = None if parameter is None else parameter_kinds(parameter)
    if named_none(requested, declared):
        names = none_means if kinds is None else DENSE | {n for n, k in KIND_OF.items() if k in kinds}
    else:
        other = sorted(requested - ALL_OUTPUTS)
        if other:
            raise ValueError(f"output {', '.join(other)}: this embedding model sends "
                             f"{', '.join(sorted(ALL_OUTPUTS))}; SCORES come from a reranker")
        names = requested
        if kinds is not None:
            left_out = sorted(n for n in names if n in KIND_OF and KIND_OF[n] not in kinds)
            if left_out:
                raise ValueError(f"the request names {', '.join(left_out)} as outputs but its parameter "
                                 f"'outputs' ({parameter!r}) leaves them out: name only the outputs you want")
            unnamed = sorted(k for k in kinds if not any(KIND_OF.get(n) == k for n in names))
            if unnamed:
                wanted = [n for n, k in KIND_OF.items() if k in unnamed]
                raise ValueError(f"request parameter 'outputs' asks for {', '.join(unnamed)}, but the request does "
                                 f"not name {', '.join(wanted)} among its outputs, so they would not be sent "
                                 f"({ENCODE_HINT})")
    return names, frozenset(KIND_OF[n] for n in names if n != "EMBEDDINGS") & ENGINE_KINDS


def refuse_unsent(requested, declared, sent: frozenset, what: str) -> None:
    """ValueError when a request names outputs (not none) beyond `sent`: `what` says what the model is."""
    if named_none(requested, declared):
        return
    extra = sorted(frozenset(requested) - sent)
    if extra:
        raise ValueError(f"output {', '.join(extra)}: {what} sends {', '.join(sorted(sent))} only")
