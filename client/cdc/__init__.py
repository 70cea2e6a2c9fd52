"""Change data capture: PostgreSQL logical decoding -> a topic -> a replica database
(ordered binlog replication, MetaQ's canonical use).

| module | its one job |
|---|---|
| ``decoding`` | ``test_decoding``'s text rows -> changes and whole transactions |
| ``message`` | a transaction as the JSON of one message (or of several parts) |
| ``capture`` | ``Capture``: slot -> ordered producer; the slot advanced after the broker's ack |
| ``apply`` | ``Applier``: consumer -> replica via SQLAlchemy, exactly once (``commit_in`` + LSN) |

The commands are ``pymetaq cdc capture`` and ``pymetaq cdc apply`` (``pymetaq.client.cli.cdc``);
the guide is ``docs/cdc.md``. ``apply`` needs the ``sql`` extra, ``capture`` the ``pg`` extra.

Thread-safety: see each class.
"""

from __future__ import annotations

from pymetaq.client.cdc.capture import Capture, CaptureConfig, CaptureError
from pymetaq.client.cdc.decoding import Change, Transaction

__all__ = ["Capture", "CaptureConfig", "CaptureError", "Change", "Transaction"]
