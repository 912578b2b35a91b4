"""The execute() of a decoupled Python model of ours: every request gets exactly one response, with
the FINAL flag, and nothing after it; execute() only admits the requests and returns None.

    class SomeModel(DecoupledModel):
        def admit(self, request, sender, received_ns): ...   # read and check it, hand it on; whoever
                                                             # finishes it answers: send_final(sender, ...)
        def refusal(self, error): ...                        # the error response of a refused request

A request that admit() refuses (it raises) is answered at once, on execute()'s thread, with
refusal(error), from inside the except block (so refusal may log the traceback). received_ns: when
execute() took the request (time.perf_counter_ns()) while stage timing is on (self.clock, a
StageClock: rose_backend/serving/stage_clock.py), else 0.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import triton_python_backend_utils as pb_utils


def send_final(sender, response) -> None:
    """A request's one response, with the FINAL flag: Triton is done with the request after it."""
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class DecoupledModel(ABC):
    clock = None                    # a StageClock while stage timing is on

    def execute(self, requests):
        clock = self.clock
        for request in requests:
            received = time.perf_counter_ns() if clock is not None else 0
            sender = request.get_response_sender()
            try:
                self.admit(request, sender, received)
            except Exception as e:  # every request gets its one FINAL response, whatever went wrong
                send_final(sender, self.refusal(e))
        return None

    @abstractmethod
    def admit(self, request, sender, received_ns: int) -> None:
        """Read and check the request and hand it on (raise to refuse it)."""

    @abstractmethod
    def refusal(self, error: Exception):
        """The error response of a request admit() refused."""
