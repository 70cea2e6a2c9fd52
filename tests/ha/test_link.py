"""The samsa master's link (:class:`pymetaq.ha.sync.SyncLink`) against a scripted slave on
127.0.0.1 in this process: what it sends a slave that says it is MetaQ (``sync`` only, the
exact wire form) and one that says it is pymetaq (one ``bsync`` per stored batch), and that a
``bsync`` reply naming another batch fails the batch (nothing acknowledged on a wrong answer).
"""

from __future__ import annotations

import asyncio

from pymetaq.client.protocol import (
    NEED_DATA,
    BatchSyncCommand,
    Event,
    NeedData,
    Parser,
    ResultReply,
    Role,
    SyncCommand,
    VersionCommand,
    encode,
)
from pymetaq.ha.config import SamsaConfig
from pymetaq.ha.sync import SyncFailed, SyncLink
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record

RECORDS = bytearray(encode_record(b"one", 0, 11) + encode_record(b"two!", 1, 12))


class ScriptedSlave:
    """Answers ``version`` with ``version`` and each (b)sync as a slave whose log starts at
    0 would (``lie``: a bsync reply naming one record fewer); keeps every frame it got."""

    def __init__(self, version: bytes, lie: bool = False) -> None:
        self.version, self.lie = version, lie
        self.frames = bytearray()
        self.events: list[Event] = []
        self.offset = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        parser = Parser(Role.SERVER)
        while data := await reader.read(65536):
            self.frames += data
            parser.feed(data)
            while (event := parser.next_event()) is not NEED_DATA:
                assert not isinstance(event, NeedData)
                self.events.append(event)
                writer.write(encode(self.answer(event)))

    def answer(self, event: Event) -> ResultReply:
        if isinstance(event, VersionCommand):
            return ResultReply(200, self.version, event.opaque)
        if isinstance(event, SyncCommand):
            body = b"%d %d %d" % (event.msg_id, event.partition, self.offset)
            self.offset += 20 + len(event.data)
            return ResultReply(200, body, event.opaque)
        assert isinstance(event, BatchSyncCommand)
        first = int.from_bytes(bytes(event.body[8:16]), "big", signed=True)
        count = event.count - 1 if self.lie else event.count
        body = b"%d %d %d %d" % (first, event.partition, self.offset, count)
        self.offset += len(event.body)
        return ResultReply(200, body, event.opaque)


async def replicate_to(slave: ScriptedSlave) -> tuple[SyncLink, BaseException | None]:
    server = await asyncio.start_server(slave.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = SyncLink(SamsaConfig("127.0.0.1", port, send_timeout_ms=5000, check_interval_ms=20))
    link.start()
    try:
        await asyncio.wait_for(link.detected.wait(), 10)
        try:
            await asyncio.wait_for(link.replicate("t", 3, RECORDS), 10)
            error: BaseException | None = None
        except SyncFailed as e:
            error = e
        return link, error
    finally:
        await link.close()
        server.close()
        for writer in slave.writers:
            writer.close()
            await writer.wait_closed()
        await server.wait_closed()


def test_a_metaq_slave_gets_metaqs_sync_commands_in_one_write() -> None:
    slave = ScriptedSlave(b"1.4.6.2")
    link, error = asyncio.run(replicate_to(slave))
    assert error is None and not link.batched
    version, one, two = slave.events
    assert isinstance(version, VersionCommand)
    assert (one, two) == (
        SyncCommand("t", 3, b"one", 0, 11, checksum(b"one"), version.opaque + 1),
        SyncCommand("t", 3, b"two!", 1, 12, checksum(b"two!"), version.opaque + 2),
    )
    assert slave.frames.endswith(encode(one) + encode(two))  # MetaQ's bytes, one after another


def test_a_pymetaq_slave_gets_one_bsync_per_batch() -> None:
    slave = ScriptedSlave(b"pymetaq-0.1.0 (MetaQ 1.4 protocol)")
    link, error = asyncio.run(replicate_to(slave))
    assert error is None and link.batched
    version, batch = slave.events
    assert isinstance(version, VersionCommand)
    assert batch == BatchSyncCommand(
        "t", 3, RECORDS, 2, checksum(bytes(RECORDS)), version.opaque + 1
    )


def test_a_bsync_reply_for_another_batch_fails_the_batch() -> None:
    slave = ScriptedSlave(b"pymetaq-0.1.0", lie=True)
    link, error = asyncio.run(replicate_to(slave))
    assert isinstance(error, SyncFailed)
    assert "the slave confirmed '11 3 0 1', not 2 from 11" in str(error)
    assert link.failures == 1
