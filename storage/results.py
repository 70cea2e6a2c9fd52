"""What a partition log's appends and reads return: plain values, no behaviour.

Thread-safe: frozen dataclasses and an enum.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from pymetaq.storage.segment import FileRegion


@dataclass(frozen=True)
class AppendResult:
    offset: int  # byte position of the first record
    length: int  # bytes appended
    count: int  # records appended
    first_msg_id: int  # ids are first_msg_id, first_msg_id + 1, ... (consecutive)


DurableCallback = Callable[[AppendResult, BaseException | None], None]


class ReadStatus(enum.Enum):
    OK = "ok"
    NO_DATA = "no_data"
    OUT_OF_RANGE = "out_of_range"


@dataclass(frozen=True)
class ReadResult:
    status: ReadStatus
    offset: int  # OK: the start; OUT_OF_RANGE: the nearest offset holding data
    region: FileRegion | None  # OK only
