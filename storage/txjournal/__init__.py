"""pymetaq.storage.txjournal: the broker's transaction redo journal and held messages.

- :mod:`.format`: the byte layout of journal files and records (a table in its docstring);
- :mod:`.journal`: files, appends, ``flushTxLogAtCommit``, rolling, replay, deletion;
- :mod:`.checkpoint`: checkpoint files;
- :mod:`.store`: :class:`TxStore`, the held messages and the commit protocol;
- :mod:`.rebuild` / :mod:`.recover`: startup recovery (committed transactions applied exactly
  once, unprepared ones rolled back, prepared XA branches restored).

Imports only ``pymetaq.storage``; the transaction state machine (XA states, timeouts, wire
replies) is the broker's (``pymetaq.server.transaction``).
"""

from pymetaq.storage.txjournal.format import Outcome
from pymetaq.storage.txjournal.journal import (
    JournalConfig,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    JournalPos,
    ReplayReport,
    TxJournal,
)
from pymetaq.storage.txjournal.recover import TxRecovery, TxRecoveryError
from pymetaq.storage.txjournal.store import (
    CheckpointJob,
    CommitResult,
    HeldState,
    HeldTx,
    HeuristicEntry,
    TxStore,
)

__all__ = [
    "CheckpointJob",
    "CommitResult",
    "HeldState",
    "HeldTx",
    "HeuristicEntry",
    "JournalConfig",
    "JournalCorrupt",
    "JournalError",
    "JournalFailed",
    "JournalPos",
    "Outcome",
    "ReplayReport",
    "TxJournal",
    "TxRecovery",
    "TxRecoveryError",
    "TxStore",
]
