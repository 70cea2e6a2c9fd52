"""Real PostgreSQL and ZooKeeper servers for tests (stdlib only).

Each server runs as our own Popen child on 127.0.0.1 with a free port and a temp dir created
with ``tempfile.mkdtemp(dir="/tmp")`` (never pytest's 0700 ``tmp_path``: the ``postgres`` user
cannot enter it).  Servers are stopped by PID; ``PR_SET_PDEATHSIG`` makes them die with the
test process if it is SIGKILLed, and ``start_new_session=True`` keeps Ctrl-C away from them.

A missing binary raises :class:`ServiceUnavailable` (the fixtures skip or fail on it); any other
start failure raises ``RuntimeError`` with the tail of the server log.

Thread-safety: each server object is meant to be driven by one thread (the fixture's).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ServiceUnavailable(Exception):
    """A service's binaries are not installed on this machine."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pdeathsig(sig: int) -> Callable[[], None]:
    """A preexec_fn that asks the kernel to send ``sig`` to the child when we die."""

    def set_it() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return set_it


def _log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def _wait_until(
    pred: Callable[[], bool], proc: subprocess.Popen[Any], log: Path, what: str
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_log_tail(log)}")
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {START_TIMEOUT_S}s:\n{_log_tail(log)}")


def _stop_pid(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)


# --------------------------------------------------------------------------- PostgreSQL


def _forced_missing(name: str) -> None:
    """``PYMETAQ_FORCE_MISSING=postgresql,zookeeper`` pretends binaries are absent (to test
    the skip-vs-fail path of the fixtures)."""
    if name in os.environ.get("PYMETAQ_FORCE_MISSING", "").split(","):
        raise ServiceUnavailable(f"{name}: forced missing by PYMETAQ_FORCE_MISSING")


def find_pg_bindir() -> str:
    """$PG_BINDIR, then ``pg_config --bindir``, then /usr/lib/postgresql/*/bin, then PATH."""
    _forced_missing("postgresql")
    candidates: list[str] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
            )
            candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    for d in candidates:
        if d and all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres")):
            return d
    raise ServiceUnavailable("postgresql: initdb/postgres not found (apt-get install postgresql)")


class PostgresServer:
    """A throw-away PostgreSQL cluster: initdb + ``postgres`` in the foreground."""

    def __init__(
        self, max_prepared_transactions: int = 20, settings: dict[str, str] | None = None
    ) -> None:
        self.bindir = find_pg_bindir()
        self.max_prepared_transactions = max_prepared_transactions
        #: ``-c`` settings over the test defaults (e.g. ``synchronous_commit=on`` for a benchmark)
        self.extra_settings = dict(settings or {})
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: dict[str, Any] = {}

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` maintenance database."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> PostgresServer:
        self.dir = Path(tempfile.mkdtemp(prefix="pgtest-", dir="/tmp"))
        if os.geteuid() == 0:  # initdb refuses to run as root
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError as e:
                raise ServiceUnavailable("postgresql: no 'postgres' system user") from e
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        log = self.dir / "postgres.log"
        data = self.dir / "data"
        init = subprocess.run(
            [
                *(f"{self.bindir}/initdb", "-D", str(data), "-U", "postgres", "-A", "trust"),
                *("-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"),
            ],
            capture_output=True,
            cwd=self.dir,
            timeout=120,
            **self._user,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace')[-3000:]}")
        self.port = free_port()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "max_prepared_transactions": str(self.max_prepared_transactions),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            # logical decoding (pymetaq cdc capture reads a replication slot)
            "wal_level": "logical",
            "max_replication_slots": "20",
            **self.extra_settings,
        }
        args = [f"{self.bindir}/postgres", "-D", str(data)]
        for k, v in settings.items():
            args += ["-c", f"{k}={v}"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=_pdeathsig(signal.SIGINT),
                **self._user,
            )
        _wait_until(self._ready, self.proc, log, "postgres")
        return self

    def _ready(self) -> bool:
        r = subprocess.run(
            [f"{self.bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q"],
            capture_output=True,
            timeout=10,
        )
        return r.returncode == 0

    def stop(self) -> None:
        """Fast shutdown (SIGINT) by PID, then remove the temp dir."""
        if self.proc is not None:
            _stop_pid(self.proc, signal.SIGINT)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def create_database(self) -> str:
        """Create a fresh database; return its name."""
        import sqlalchemy as sa

        name = f"t_{uuid.uuid4().hex[:16]}"
        eng = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        try:
            with eng.connect() as c:
                c.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            eng.dispose()
        return name

    def drop_database(self, name: str) -> None:
        """Roll back the database's in-doubt prepared xacts, drop its replication slots, then
        drop it (FORCE)."""
        import sqlalchemy as sa

        eng = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        db_eng = sa.create_engine(
            self.url_for(name), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        try:
            with eng.connect() as c:
                gids: list[str] = list(
                    c.exec_driver_sql(
                        "SELECT gid FROM pg_prepared_xacts WHERE database = %(d)s", {"d": name}
                    ).scalars()
                )
            if gids:
                with db_eng.connect() as dc:
                    for gid in gids:
                        dc.exec_driver_sql("ROLLBACK PREPARED '" + gid.replace("'", "''") + "'")
            with eng.connect() as c:  # a replication slot (pymetaq cdc) also blocks the drop
                c.exec_driver_sql(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %(d)s AND NOT active",
                    {"d": name},
                )
                c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            db_eng.dispose()
            eng.dispose()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- ZooKeeper


def find_zookeeper_classpath() -> tuple[str, str]:
    """(java binary, classpath) or ServiceUnavailable.  $ZOOKEEPER_CLASSPATH overrides."""
    _forced_missing("zookeeper")
    java = shutil.which("java")
    if java is None:
        raise ServiceUnavailable("zookeeper: java not found (apt-get install zookeeper)")
    cp = os.environ.get("ZOOKEEPER_CLASSPATH")
    if not cp:
        jar = "/usr/share/java/zookeeper.jar"
        if not os.path.exists(jar):
            raise ServiceUnavailable(f"zookeeper: {jar} not found (apt-get install zookeeper)")
        parts = [jar]
        if os.path.exists("/usr/share/java/slf4j-simple.jar"):
            parts.append("/usr/share/java/slf4j-simple.jar")
        cp = ":".join(parts)
    return java, cp


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter word; return the reply ('' on connection failure)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(cmd.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


ZOO_CFG = """\
tickTime=500
initLimit=10
syncLimit=5
dataDir={data}
clientPortAddress=127.0.0.1
clientPort={port}
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons
forceSync=no
maxClientCnxns=0
"""


class ZooKeeperServer:
    """A standalone ZooKeeper (java QuorumPeerMain) on a free port; sessions of 1-10 s."""

    def __init__(self) -> None:
        self.java, self.classpath = find_zookeeper_classpath()
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperServer:
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="zktest-", dir="/tmp"))
            self.port = free_port()
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(ZOO_CFG.format(data=self.dir / "data", port=self.port))
        log = self.dir / "zookeeper.log"
        args = [self.java, "-Xmx128m", "-Xms16m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        args += ["-Xss512k", "-Djava.awt.headless=true"]
        args += ["-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]
        args += ["-Dzookeeper.admin.enableServer=false", "-cp", self.classpath]
        args += ["org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=_pdeathsig(signal.SIGTERM),
            )
        _wait_until(lambda: "Mode:" in four_letter(self.port, "srvr"), self.proc, log, "zookeeper")
        return self

    def stop(self, *, keep_data: bool = False) -> None:
        """SIGTERM by PID (SIGKILL to the group after a timeout); remove the dir unless kept."""
        if self.proc is not None:
            _stop_pid(self.proc, signal.SIGTERM)
            self.proc = None
        if not keep_data and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def expire_session(zk_server: ZooKeeperServer, client: Any) -> None:
    """Expire a kazoo client's session deterministically (same session id, then close)."""
    session_id, password = client.client_id
    expire_session_id(zk_server.hosts, session_id, password)


def expire_session_id(hosts: str, session_id: int, password: bytes) -> None:
    """Expire the session ``session_id`` (of any process): attach a second client to it with
    its password and close it.  The owner's connection is dropped at the attach, so it stops
    hearing from the server before its ephemeral nodes are deleted."""
    from kazoo.client import KazooClient

    other = KazooClient(hosts=hosts, client_id=(session_id, password))
    other.start(timeout=10)
    other.stop()
    other.close()


def service_status() -> dict[str, str]:
    """{'zookeeper': 'found' | reason, 'postgresql': 'found' | reason} for the report header."""
    status: dict[str, str] = {}
    for name, probe in (("zookeeper", find_zookeeper_classpath), ("postgresql", find_pg_bindir)):
        try:
            probe()
            status[name] = "found"
        except ServiceUnavailable as e:
            status[name] = f"MISSING ({e})"
    return status
