"""Where a gateway request's time goes: rose's stage clock (rose_backend/serving/stage_clock.py) in
each gateway worker, on when $ROSE_STAGE_TIMES names a folder (off, the marks cost one global test).

    begin()            # POST /v1/embeddings: its headers are in ("received"); the task's request from here
    mark("tokenized")  # each later mark closes the stage it names, for the current task's request
    finish()           # the answer was written: the request's stages join the samples
    write()            # at shutdown: <folder>/gateway_<pid>.json and .marks.jsonl

Stages of a text request: received, body_read, parsed, tokenized, sent (the chunk placed and
queued on its stream), answered (rose's answer is back on the loop), response_built, written.
"""
from __future__ import annotations

from contextvars import ContextVar

from rose_backend.serving.stage_clock import StageClock

CLOCK = StageClock.from_env("gateway")
_current: ContextVar = ContextVar("rose_gateway_request", default=None)


class _Request:
    __slots__ = ("marks",)

    def __init__(self):
        self.marks: list = []


def begin() -> None:
    if CLOCK is not None:
        r = _Request()
        CLOCK.mark(r, "received")
        _current.set(r)


def mark(stage: str) -> None:
    if CLOCK is not None:
        r = _current.get()
        if r is not None:
            CLOCK.mark(r, stage)


def sent() -> None:
    """The client's on_sent hook: a call's chunks were just sent."""
    mark("sent")


def finish() -> None:
    if CLOCK is not None:
        r = _current.get()
        if r is not None:
            CLOCK.mark(r, "written")
            CLOCK.finish(r)
            _current.set(None)


def write() -> None:
    if CLOCK is not None:
        CLOCK.write()
