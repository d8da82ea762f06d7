"""pynumaflow's own source server with a small in-memory source, the reference that
tests/process/test_numaflow.py drives with the same call sequence as raftlog's sidecar.

    python tests/process/numaflow_reference.py SOCKET SERVER_INFO COUNT

Serves COUNT records (payload b"m<i>", offset b"<i>") through `SourceAsyncServer` (pynumaflow's
server, its handshake and EOT handling, its server-info writer). Read hands out the nacked
records first, then unread ones; ack forgets them; pending = records never handed out. It runs
until SIGTERM (pynumaflow's aiorun loop; it also exits by itself on any handler error).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from pynumaflow.shared.asynciter import NonBlockingIterator
from pynumaflow.sourcer import (
    AckRequest,
    Message,
    NackRequest,
    Offset,
    PartitionsResponse,
    PendingResponse,
    ReadRequest,
    SourceAsyncServer,
    Sourcer,
    get_default_partitions,
)


class ListSource(Sourcer):
    def __init__(self, count: int) -> None:
        self.count = count
        self.next_index = 0
        self.unacked: set[int] = set()
        self.nacked: list[int] = []

    async def read_handler(self, datum: ReadRequest, output: NonBlockingIterator) -> None:
        for _ in range(datum.num_records):
            if self.nacked:
                index = self.nacked.pop(0)
            elif self.next_index < self.count:
                index = self.next_index
                self.next_index += 1
            else:
                return
            self.unacked.add(index)
            await output.put(Message(payload=b"m%d" % index,
                                     offset=Offset.offset_with_default_partition_id(
                                         str(index).encode()),
                                     event_time=datetime.now(UTC)))

    async def ack_handler(self, ack_request: AckRequest) -> None:
        for offset in ack_request.offsets:
            self.unacked.discard(int(offset.offset))

    async def nack_handler(self, ack_request: NackRequest) -> None:
        for offset in ack_request.offsets:
            self.unacked.discard(int(offset.offset))
            self.nacked.append(int(offset.offset))

    async def pending_handler(self) -> PendingResponse:
        return PendingResponse(count=self.count - self.next_index)

    async def active_partitions_handler(self) -> PartitionsResponse:
        return PartitionsResponse(partitions=get_default_partitions())


def main() -> None:
    socket_path, info_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    SourceAsyncServer(ListSource(count), sock_path=socket_path,
                      server_info_file=info_path).start()


if __name__ == "__main__":
    main()
