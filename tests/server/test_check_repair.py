"""``pymetaq check`` / ``pymetaq repair`` and a broker on damaged logs (issue 8, defect 7).

The damage is made on disk between two runs of a real broker; the commands run as the operator
would run them (``python -m pymetaq.server.cli``), and their exit codes and output are exact
enough to script against; no output ever holds a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame, put_line

pytestmark = pytest.mark.integration

TOPICS = {"t": {"numPartitions": 3}}
SYSTEM = {"maxSegmentSize": 4096}


def pymetaq(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def fill(broker: BrokerProcess) -> dict[int, list[tuple[int, bytes]]]:
    """Three partitions, ~10 segments each; returns partition -> [(offset, data)]."""
    stored: dict[int, list[tuple[int, bytes]]] = {0: [], 1: [], 2: []}
    with Wire(broker.address) as w:
        for n in range(30):
            partition = n % 3
            payloads = [b"p%d-%d-" % (n, i) + b"x" * 300 for i in range(4)]
            reply = w.call(bput_frame("t", partition, payloads, n))
            assert isinstance(reply, ResultReply) and reply.code == 200, reply
            offset = int(reply.body.split()[2])
            for p in payloads:
                stored[partition].append((offset, p))
                offset += 20 + len(p)
    return stored


def segments(broker: BrokerProcess, partition: int) -> list[Path]:
    d = broker.data_path / f"t-{partition}"
    return sorted(p for p in d.iterdir() if p.name.endswith(".meta"))


def fetch(w: Wire, partition: int) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
    """Every record from offset 0, following 301s; also the (from, to) of each 301."""
    out: list[tuple[int, bytes]] = []
    moves: list[tuple[int, int]] = []
    offset = 0
    for _ in range(10_000):  # bounded walk
        reply = w.call(b"get t g %d %d 1048576 1\r\n" % (partition, offset))
        if isinstance(reply, ResultReply):
            if reply.code == 301:
                moves.append((offset, int(reply.body)))
                offset = int(reply.body)
                continue
            assert reply.code == 404, reply
            return out, moves
        assert isinstance(reply, ValueReply)
        records = list(iter_records(reply.data, offset))
        out += [(r.offset, r.data) for r in records]
        offset = records[-1].offset + records[-1].size
    raise AssertionError("the walk did not end")


def test_check_repair_and_a_broker_that_fences_then_serves(tmp_path: Path) -> None:
    broker = BrokerProcess.start(tmp_path, topics=TOPICS, system=SYSTEM)
    with broker:
        stored = fill(broker)
        assert broker.terminate() == 0
        config = str(broker.config_path)

        healthy = pymetaq("check", "-f", config, cwd=tmp_path)
        assert healthy.returncode == 0, healthy.stdout
        assert "3 partition(s) checked: 3 ok, 0 damaged" in healthy.stdout

        before_hole, hole = segments(broker, 0)[1:3]
        hole.unlink()  # a missing middle segment
        bad = segments(broker, 1)[1]
        with open(bad, "r+b") as f:  # a bit flip inside an immutable segment
            f.seek(100)
            f.write(b"\x00\xff")

        found = pymetaq("check", "-f", config, cwd=tmp_path)
        assert found.returncode == 1
        assert f"- {before_hole.name}: a hole of" in found.stdout  # said after its predecessor
        assert f"- {bad.name}: checksum mismatch at offset" in found.stdout
        assert "3 partition(s) checked: 1 ok, 2 damaged" in found.stdout
        assert f"pymetaq repair -f {config}" in found.stdout

        broker.launch()  # the damaged partitions are fenced, the healthy one serves
        assert "is fenced (damaged)" in broker.log_text()
        with Wire(broker.address) as w:
            got = w.call(b"get t g 0 0 4096 1\r\n")
            assert isinstance(got, ResultReply) and got.code == 500
            assert b"damaged and fenced" in got.body
            put = w.call(put_line("t", 0, b"x", 2, checksum(b"x")))
            assert isinstance(put, ResultReply) and put.code == 500
            assert b"damaged and fenced" in put.body
            assert fetch(w, 2)[0] == stored[2]
        live = pymetaq("check", "-f", config, cwd=tmp_path)
        assert f"broker pid {broker.proc.pid} is running on it" in live.stdout  # type: ignore[union-attr]
        refused = pymetaq("repair", "-f", config, cwd=tmp_path)
        assert refused.returncode == 2
        assert f"in use by another pymetaq process (pid {broker.proc.pid})" in refused.stderr  # type: ignore[union-attr]
        assert broker.terminate() == 0

        fixed = pymetaq("repair", "-f", config, cwd=tmp_path)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "accepted the gap" in fixed.stdout and "moved " in fixed.stdout
        assert "2 partition(s) repaired, 0 still damaged" in fixed.stdout
        assert any(p.name.endswith(".damaged-1") for p in (broker.data_path / "t-1").iterdir())
        again = pymetaq("check", "-f", config, cwd=tmp_path)
        assert again.returncode == 0, again.stdout

        broker.launch()
        with Wire(broker.address) as w:
            for partition in (0, 1):
                records, moves = fetch(w, partition)
                assert moves, "a consumer reaching the gap is moved past it (301)"
                want = dict(stored[partition])
                assert all(want.get(o) == d for o, d in records)  # nothing served is wrong
                lost = [o for o in want if o not in dict(records)]
                lo, hi = moves[0]
                assert all(lo <= o < hi for o in lost)  # only the damaged range is gone
            reply = w.call(put_line("t", 0, b"after", 3, checksum(b"after")))
            assert isinstance(reply, ResultReply) and reply.code == 200
            assert int(reply.body.split()[2]) >= stored[0][-1][0]  # never a reused offset


def test_check_and_repair_usage_errors(tmp_path: Path) -> None:
    missing = pymetaq("check", "--data-path", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such data directory" in missing.stderr
    ini = tmp_path / "bad.ini"
    ini.write_text("[system]\ndeleteWhen=0 0 99 * * ?\n[topic=t]\n")
    bad = pymetaq("repair", "-f", str(ini), cwd=tmp_path)
    assert bad.returncode == 2 and "configuration error" in bad.stderr
    assert "bad value for 'deleteWhen'" in bad.stderr
    usage = pymetaq("check", "-f", str(ini), "--data-path", str(tmp_path), cwd=tmp_path)
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr
    default = pymetaq("check", cwd=tmp_path)  # the packaged default's ./data, not there
    assert default.returncode == 2, default.stderr
    assert default.stderr == (
        f"pymetaq check: no such data directory: {tmp_path / 'data'}\n"
        "hint: name the broker's with -f or --data-path\n"
    )


def test_check_an_empty_data_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    out = pymetaq("check", "--data-path", str(tmp_path / "d"), cwd=tmp_path)
    assert out.returncode == 0 and "0 partition(s) checked" in out.stdout
    assert os.listdir(tmp_path / "d") == []  # read-only: not even a lock file


def test_a_deleted_newest_segment_moves_consumers_on_and_never_reuses_offsets(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess.start(tmp_path, topics=TOPICS, system=SYSTEM)
    with broker:
        stored = fill(broker)[0]
        end = stored[-1][0] + 20 + len(stored[-1][1])
        assert broker.terminate() == 0
        newest = segments(broker, 0)[-1]
        cut = int(newest.name[:20])
        newest.unlink()  # an operator deletes the newest segment
        out = pymetaq("check", "-f", str(broker.config_path), cwd=tmp_path)
        assert out.returncode == 1
        assert f"the log ends at {cut} but offsets up to {end} were handed out" in out.stdout
        js = pymetaq("check", "-f", str(broker.config_path), "--json", cwd=tmp_path)
        assert js.returncode == 1
        [root] = json.loads(js.stdout)
        assert root["data_path"] == str(broker.data_path) and root["broker_pid"] is None
        bad = [p for p in root["partitions"] if p["damaged"]]
        assert [(p["topic"], p["partition"]) for p in bad] == [("t", 0)]
        assert any(f"the log ends at {cut}" in f["message"] for f in bad[0]["findings"])
        broker.launch()
        assert f"continuing at {end}" in broker.log_text()
        with Wire(broker.address) as w:
            for consumer_at in (cut, end - 1):  # a consumer that had read past the cut
                got = w.call(b"get t g 0 %d 4096 %d\r\n" % (consumer_at, consumer_at))
                assert got == ResultReply(301, b"%d" % end, consumer_at), got
            reply = w.call(put_line("t", 0, b"new", 9, checksum(b"new")))
            assert isinstance(reply, ResultReply) and reply.code == 200
            assert int(reply.body.split()[2]) == end  # not a reused offset
            assert w.call(b"offset t g 0 %d 10\r\n" % cut) == ResultReply(200, b"%d" % end, 10)
            records, moves = fetch(w, 0)
            assert moves == [(cut, end)] and records[-1] == (end, b"new")
            assert records[:-1] == [(o, d) for o, d in stored if o < cut]
