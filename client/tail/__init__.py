"""``pymetaq tail``: a log shipping agent (MetaQ's tail4j) that follows files into a topic.

* :mod:`.config`: the INI (tail4j's layout) or TOML file, and the flags' one source.
* :mod:`.files`: finding files (globs, a directory + name regex), identity by device+inode,
  whole lines or multi-line records from a byte position, truncation and copies.
* :mod:`.checkpoint`: the durable checkpoint (atomic JSON, one per source).
* :mod:`.readback`: what the broker already holds from this agent (read at start).
* :mod:`.source`: one source's cycle (acks, truncation, discovery, reading, checkpoint).
* :mod:`.agent`: every source in one thread, restarts with backoff.

The promise: a record is in the checkpoint only after the broker acknowledged it, and at
start the agent reads back what it sent after its checkpoint, so after ``kill -9`` nothing is
lost and nothing is sent twice (ordered mode; see ``docs/tail.md``).
"""

from __future__ import annotations

from pymetaq.client.tail.agent import TailAgent
from pymetaq.client.tail.config import AgentConfig, ConfigError, SourceConfig, load_config

__all__ = ["AgentConfig", "ConfigError", "SourceConfig", "TailAgent", "load_config"]
