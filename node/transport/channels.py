"""Long-lived gRPC channels to other nodes' client ports, pooled by address."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from raftlog.base import limits

# Channels for relayed server streams (Subscribe): without the BDP probe a stream's receive window
# stays at gRPC's 64 KiB, so a relay whose client does not read holds at most that much of the
# serving node's answer, not the megabytes a grown window lets in.
STREAM_RELAY_OPTIONS: list[tuple[str, Any]] = [("grpc.http2.bdp_probe", 0)]


class ChannelPool:
    """At most limits.channels_max channels; the least recently used is closed beyond."""

    def __init__(self, *, options: list[tuple[str, Any]] | None = None,
                 dial: Callable[[str], str] | None = None) -> None:
        """`dial` maps the address a node is known by to the one to connect to (a proxy on
        the link, config.NodeConfig.dial); channels stay keyed by the former."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._dial = dial or (lambda address: address)
        merged = dict([
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # A node that restarts is reachable again within a second, not after grpc's
            # default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", limits.reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", limits.reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", limits.reconnect_backoff_ms_max),
        ])
        merged.update(options or ())  # the caller's options replace the defaults
        self._options = list(merged.items())

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.pop(address, None)
        if channel is None:
            channel = grpc.aio.insecure_channel(self._dial(address), options=self._options)
            if len(self._channels) >= limits.channels_max:
                oldest = next(iter(self._channels))
                self._channels.pop(oldest)
        self._channels[address] = channel
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
