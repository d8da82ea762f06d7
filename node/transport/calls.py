"""What an incoming call carries that outlives the front-end that received it: the caller's
deadline, how often it was forwarded, and the metadata to send on. Protocol-neutral: a gRPC
front-end makes one with `Call.from_grpc(context)`, another front-end with `Call(...)`.

The forwarder (forwarding.py) sends a call on with `outgoing()`: the caller's metadata, the hop
count raised by one, the request id of the call running here (logctx.py), and HOP_LIMIT once a
call has gone round `hops_max` times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import logctx
from raftlog.node.transport.auth import AUTHORIZATION_HEADER, IDENTITY_HEADER

HOPS_HEADER = "raftlog-hops"
LOCAL_HEADER = "raftlog-local"  # on a fan-out call: answer for this node only
# Headers that belong to one HTTP/2 hop, never sent on; and the caller's credentials, which
# the forwarder replaces with the identity this node verified (auth.py).
_HOP_BY_HOP = frozenset({"user-agent", "te", "content-type", AUTHORIZATION_HEADER,
                         IDENTITY_HEADER})

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Call:
    """One incoming call: `deadline` on time.monotonic() (None: the caller set none), `hops`
    forwards so far, `metadata` the caller's headers to send on, `local_only` when the caller
    asked this node alone (a fan-out)."""

    deadline: float | None = None
    hops: int = 0
    metadata: tuple[tuple[str, str], ...] = ()
    local_only: bool = False

    @classmethod
    def from_grpc(cls, context: Context) -> Call:
        remaining = context.time_remaining()
        hops = 0
        local_only = False
        kept: list[tuple[str, str]] = []
        for key, value in context.invocation_metadata() or ():
            text = value if isinstance(value, str) else bytes(value).decode("replace")
            if key == HOPS_HEADER:
                hops = int(text) if text.isdigit() else limits.forward_hops_max
            elif key == LOCAL_HEADER:
                local_only = True
            elif not key.startswith(("grpc-", ":")) and key not in _HOP_BY_HOP:
                kept.append((key, text))
        deadline = None if remaining is None else time.monotonic() + remaining
        return cls(deadline=deadline, hops=hops, metadata=tuple(kept), local_only=local_only)

    def remaining_s(self) -> float | None:
        """Seconds left before the caller's deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.001)

    def expired(self) -> bool:
        """The caller's deadline has passed: it has given up, and may have sent the call again."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def timeout_s(self, *, default_s: float | None = None) -> float:
        """The timeout for a call made on this one's behalf: the caller's remaining deadline,
        else `default_s` (default: limits.forward_timeout_s_default)."""
        remaining = self.remaining_s()
        if remaining is not None:
            return remaining
        return limits.forward_timeout_s_default if default_s is None else default_s

    def outgoing(self) -> list[tuple[str, str]]:
        """The metadata to forward with; HOP_LIMIT once hops reached limits.forward_hops_max.
        The request id is the one this node gave the call (the caller's when it sent a valid
        one), so the next node logs under the same id."""
        if self.hops >= limits.forward_hops_max:
            raise RaftlogError(Reason.HOP_LIMIT, f"the call was forwarded {self.hops} times "
                               "without reaching the node that serves it", hops=self.hops)
        request_id = logctx.request_id()
        if request_id is None:
            return [*self.metadata, (HOPS_HEADER, str(self.hops + 1))]
        kept = [(key, value) for key, value in self.metadata if key != logctx.REQUEST_ID_HEADER]
        return [*kept, (HOPS_HEADER, str(self.hops + 1)), (logctx.REQUEST_ID_HEADER, request_id)]
