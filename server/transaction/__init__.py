"""pymetaq.server.transaction: MetaQ's transactions in the broker.

- :mod:`.xa`: XA codes, states and the two error shapes;
- :mod:`.manager`: the state machine, timeouts, limits, disconnect rollback, heuristics;
- :mod:`.handler`: the wire (``transaction``, transactional ``put``, ``txadmin``,
  ``stats transactions``);
- :mod:`.service`: recovery at start, checkpoints and retries, clean close.

The journal and the held messages are storage's (:mod:`pymetaq.storage.txjournal`).
"""
