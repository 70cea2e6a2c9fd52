"""What the broker already holds from this agent: the partitions read from the checkpoint's
``scan`` offsets to their ends, and each file's position moved past the chunks found there.

Every chunk the agent sends carries its place in the attribute (``ATTR``): the agent's id,
the file's identity and truncation generation, the byte range the chunk's records came from,
and how many records it holds. A chunk counts only when all its records are there (a batch
cut in two by a failure is sent again whole).

```
tail=<agent id>;id=<dev>:<ino>;g=<gen>;at=<start>-<end>;n=<records>;s=<sig>[;host=<host>;file=<path>]
```

``s`` is the crc32 of the 64 bytes before ``end`` (empty: none): a file truncated and
rewritten while the agent was down no longer has those bytes there.

``host`` and ``file`` come last so that a path may hold any character.

Thread-safety: functions; :func:`scan_partitions` runs a private consumer to its end.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.types import TopicPartition

#: (identity, generation) -> {start: (end, sig at end)}
Ranges = dict[tuple[str, int], dict[int, tuple[int, int | None]]]
#: what one chunk's attribute says: identity, generation, start, end, records, sig
Chunk = tuple[str, int, int, int, int, int | None]


def attribute(
    agent: str,
    ident: str,
    gen: int,
    start: int,
    end: int,
    n: int,
    sig: int | None,
    host: str | None,
    path: str | None,
) -> str:
    attr = f"tail={agent};id={ident};g={gen};at={start}-{end};n={n};s={'' if sig is None else sig}"
    if host is not None and path is not None:
        attr += f";host={host};file={path}"
    return attr


def parse_attribute(attr: str | None, agent: str) -> Chunk | None:
    """``(ident, gen, start, end, n, sig)`` of one of this agent's chunks, else None."""
    if not attr or not attr.startswith(f"tail={agent};"):
        return None
    try:
        parts = attr.split(";", 6)
        ident = parts[1].removeprefix("id=")
        gen = int(parts[2].removeprefix("g="))
        start_s, _, end_s = parts[3].removeprefix("at=").partition("-")
        n = int(parts[4].removeprefix("n="))
        sig_s = parts[5].removeprefix("s=")
        return ident, gen, int(start_s), int(end_s), n, int(sig_s) if sig_s else None
    except (IndexError, ValueError):
        return None


def end_offsets(servers: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The offset at the end of each partition's log now."""
    if not tps:
        return {}
    with Consumer(servers, None) as c:
        c.assign(sorted(tps))
        for tp in tps:
            c.seek_to_end(tp)
        return {tp: c.position(tp) for tp in tps}


def scan_partitions(
    servers: str, scan: dict[TopicPartition, int], agent: str, timeout_s: float = 60.0
) -> Ranges:
    """Read each partition from its offset to the end it had when the scan began; the chunks of
    ``agent`` found complete."""
    counts: Counter[Chunk] = Counter()
    if not scan:
        return {}
    ends = end_offsets(servers, list(scan))
    with Consumer(servers, None) as c:
        c.assign(sorted(scan))
        for tp in scan:
            c.seek(tp, scan[tp])
        deadline = time.monotonic() + timeout_s
        done: set[TopicPartition] = {tp for tp in scan if scan[tp] >= ends[tp]}
        while len(done) < len(scan):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading back {sorted(set(scan) - done)} took too long")
            for m in c.poll(0.5):
                tp = TopicPartition(m.topic, m.broker_id, m.partition)
                if m.offset >= ends[tp]:
                    done.add(tp)
                    continue
                chunk = parse_attribute(m.attribute, agent)
                if chunk is not None:
                    counts[chunk] += 1
                if m.next_offset >= ends[tp]:
                    done.add(tp)
            for tp in scan:
                if c.position(tp) >= ends[tp]:
                    done.add(tp)
    ranges: Ranges = defaultdict(dict)
    for (ident, gen, start, end, n, sig), seen in counts.items():
        if seen >= n and end > start:
            ranges[(ident, gen)][start] = (end, sig)
    return dict(ranges)


def chase(
    ranges: Ranges, ident: str, gen: int, pos: int, sig: int | None
) -> tuple[int, int | None]:
    """``(pos, sig)`` moved past the chunks of (ident, gen) that follow ``pos`` without a gap."""
    found = ranges.get((ident, gen))
    while found and pos in found:
        pos, sig = found[pos]
    return pos, sig
