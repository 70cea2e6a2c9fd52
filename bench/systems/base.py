"""The interface every benchmarked system implements.

A system owns its server (started on a free 127.0.0.1 port with its data under ``workdir``) and
its client calls; ``bench/run.py`` owns the case matrix, repeats, tables and charts.

Cases (each bounded by ``seconds``; every call uses a fresh topic / stream / key):

| method | measures |
|---|---|
| ``produce(msg_bytes, batch, seconds, mode)`` | acked messages/s, batched or pipelined |
| ``produce_each(msg_bytes, batch, seconds, mode)`` | acked messages/s, one client call per message (pipelined, flushed every ``batch``) |
| ``consume(msg_bytes, batch, seconds, mode)`` | received messages/s from a pre-filled log |
| ``ack_latency(rate, msg_bytes, batch, seconds, mode)`` | publish→ack latency, open-loop at ``rate`` |
| ``e2e_latency(rate, msg_bytes, batch, seconds, mode)`` | publish→consume latency, open-loop |

``batch`` caps the messages in one send (the latency cases send whatever is due, up to ``batch``).

``modes`` lists the durability configurations (the first is the default); ``consume`` runs in the
first only. ``start`` raises ``SystemUnavailable`` when the server binary or the client library is
missing, and the runner prints that as a skip note.

Thread-safety: one runner thread calls a system; a system may use threads/event loops inside a call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from bench.common import Latency, Mode, Throughput


class System(ABC):
    name: str = ""
    modes: tuple[Mode, ...] = ()
    #: the cases this system runs (``produce_each`` only where the client has a per-message
    #: pipelined call)
    cases: tuple[str, ...] = ("produce", "produce_each", "consume", "ack_latency", "e2e_latency")

    @abstractmethod
    def start(self, workdir: Path) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput: ...

    def produce_each(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        """One client call per message (the loop a user writes first); ``batch``: messages
        between checks of the clock (and, for pipelines, per round trip)."""
        raise NotImplementedError(f"{self.name} has no produce_each")

    @abstractmethod
    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput: ...

    @abstractmethod
    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency: ...

    @abstractmethod
    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency: ...

    def mode(self, name: str) -> Mode:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(f"{self.name} has no mode {name!r}")
