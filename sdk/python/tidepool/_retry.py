"""Retry policy shared by the sync and asyncio transports (no I/O).

What is retried, and why it is safe:

* A connection that could not be made (refused, unreachable): nothing was sent, so any
  request may be sent again.
* A connection reset or closed before the whole answer arrived, or an answer of 503
  ``unavailable``: the request may or may not have run. It is sent again only when a
  repeat cannot run it twice: GETs (they change nothing), and state-changing requests
  (POST, PUT, DELETE) because each carries an ``Idempotency-Key`` that stays the same on
  every attempt of one logical call; the daemon answers a repeated key with the
  recorded answer instead of running anything again.
* A client-side timeout is not retried: the command may still be running and waiting
  again is the caller's decision.

Delays grow exponentially with random jitter so that many clients failing together do
not come back in lockstep.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Optional

__all__ = ["RetryPolicy", "IDEMPOTENCY_HEADER", "ON_DISCONNECT_HEADER", "new_idempotency_key", "MUTATING_METHODS"]

#: Header carrying the idempotency key of a state-changing request.
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: Header asking the daemon to run a keyed command to its end when the client goes away
#: (``finish``), instead of killing it after a short grace period.
ON_DISCONNECT_HEADER = "Tidepool-On-Disconnect"

#: Methods that change state and therefore carry an idempotency key.
MUTATING_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def new_idempotency_key() -> str:
    """A fresh random key (uuid4), used for every attempt of one logical call."""
    return str(uuid.uuid4())


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (connection refused or reset, HTTP 503) are retried.

    Attributes:
        max_attempts: total tries of one call, including the first (1 disables retries).
        initial_backoff: delay in seconds before the first retry.
        max_backoff: upper bound of any single delay in seconds.
        multiplier: growth factor of the delay per attempt.
        jitter: fraction of each delay that is randomised (0 = none, 1 = full jitter).
    """

    max_attempts: int = 4
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoff values must be >= 0 and multiplier >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be within [0, 1]")

    def delay(self, retry: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry).

        A server's ``Retry-After`` hint raises the delay, still capped by ``max_backoff``.
        """
        base = min(self.max_backoff, self.initial_backoff * (self.multiplier ** retry))
        if retry_after is not None and retry_after > base:
            base = min(self.max_backoff, retry_after)
        return base * (1.0 - self.jitter * random.random())

    def allows(self, attempt: int) -> bool:
        """True when a call that failed on try number ``attempt`` (1-based) may try again."""
        return attempt < self.max_attempts


#: The policy used when a client is created without one.
DEFAULT_RETRY = RetryPolicy()

#: A policy that never retries.
NO_RETRY = RetryPolicy(max_attempts=1)
