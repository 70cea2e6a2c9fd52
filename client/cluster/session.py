"""The ZooKeeper plumbing the cluster components share: a kazoo client and a refresh loop.

- :func:`connect` opens a kazoo client for a ``zk://`` URL (kazoo is imported here, lazily:
  it is the ``zk`` extra) with a reconnect policy that keeps retrying every second at most,
  so a restarted ZooKeeper is found again quickly (kazoo's default backs off to an hour).
- :class:`RefreshLoop` is the one pattern every component uses, because ZooKeeper watches
  are one-shot, kazoo drops them all on a connection loss, and rapid changes coalesce: a watch
  or a state change only *wakes* the loop (never blocks, never counts); the loop's thread
  then re-reads the whole state it follows, re-arming every watch as it reads, and compares
  it with what it saw last.  A failed read (connection loss, expired session) is retried
  after ``retry_delay_s`` or as soon as the loop is woken again (e.g. by CONNECTED).

Thread-safety: :meth:`RefreshLoop.wake` may be called from any thread, including kazoo's
connection thread (state listeners) and its callback thread (watches); ``refresh`` runs only on
the loop's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pymetaq.client.cluster.errors import ClusterUnavailable
from pymetaq.client.protocol.zk import ZkUrl, parse_zk_url

log = logging.getLogger("pymetaq.cluster")

DEFAULT_SESSION_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: reconnect backoff: 0.1 s doubling to at most this.
MAX_RECONNECT_DELAY_S = 1.0


def kazoo_client(
    hosts: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S, **kwargs: Any
) -> Any:
    """An unstarted ``KazooClient`` for a ZooKeeper connect string, with fast reconnects."""
    try:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry
    except ImportError as e:  # pragma: no cover - the test extra installs kazoo
        raise ClusterUnavailable(
            "zk:// needs kazoo: pip install 'pymetaq[zk]'", retriable=False
        ) from e
    retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=MAX_RECONNECT_DELAY_S)
    return KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=retry, **kwargs)


def connect(
    url: str | ZkUrl,
    *,
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> Any:
    """A started kazoo client for ``zk://hosts[/root]`` (the root is for the caller's paths).

    Raises :class:`ClusterUnavailable` naming the hosts if no server answers in time."""
    zk_url = parse_zk_url(url) if isinstance(url, str) else url
    client = kazoo_client(zk_url.hosts, session_timeout_s=session_timeout_s)
    start_client(client, zk_url.hosts, connect_timeout_s)
    return client


def start_client(client: Any, hosts: str, connect_timeout_s: float) -> None:
    """Start a kazoo client; :class:`ClusterUnavailable` naming ``hosts`` (and the client
    closed) if no server answers within ``connect_timeout_s``."""
    try:
        client.start(timeout=connect_timeout_s)
    except Exception as e:
        client.close()
        raise ClusterUnavailable(
            f"cannot connect to ZooKeeper at {hosts} within {connect_timeout_s:g} s: {e}"
        ) from e


def session_id(client: Any) -> int | None:
    """The client's current session id, or None when it has none."""
    cid = client.client_id
    return int(cid[0]) if cid else None


def delete_if_owned(client: Any, path: str, sid: int | None) -> None:
    """Delete the ephemeral ``path`` if session ``sid`` owns it (gone already is fine; a node
    re-created by another session meanwhile is left alone)."""
    from kazoo.exceptions import BadVersionError, NoNodeError

    try:
        _, stat = client.get(path)
        if stat.ephemeralOwner == sid:
            client.delete(path, version=stat.version)
    except (NoNodeError, BadVersionError):
        pass


def negotiated_timeout_s(client: Any) -> float:
    """The session timeout the server granted (kazoo keeps it in ms)."""
    return float(getattr(client, "_session_timeout", 30000)) / 1000.0


class RefreshLoop:
    """A daemon thread that calls ``refresh()`` whenever woken (see the module docstring).

    ``refresh`` returns None (sleep until woken) or a delay in seconds after which it wants to
    run again even if nothing wakes it; an exception is logged and retried after
    ``retry_delay_s``.  Wakes that arrive while ``refresh`` runs are kept (coalesced into one
    more run), so no change is missed."""

    def __init__(
        self, name: str, refresh: Callable[[], float | None], *, retry_delay_s: float
    ) -> None:
        self.name = name
        self._refresh = refresh
        self.retry_delay_s = retry_delay_s
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # consecutive failed refreshes (observability, tests)
        self.runs = 0

    def wake(self, *_: object) -> None:
        """Ask for a refresh (usable directly as a kazoo watch or state listener)."""
        self._wakeup.set()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._wakeup.set()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the current refresh; True if the thread ended within ``timeout``."""
        self._stopping.set()
        self._wakeup.set()
        t = self._thread
        if t is None or t is threading.current_thread():
            return True
        t.join(timeout)
        return not t.is_alive()

    @property
    def woken(self) -> bool:
        """A refresh is due (woken since the last one started)."""
        return self._wakeup.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _run(self) -> None:
        delay: float | None = None
        while not self._stopping.is_set():
            self._wakeup.wait(delay)
            if self._stopping.is_set():
                return
            self._wakeup.clear()
            try:
                delay = self._refresh()
                self.failures = 0
            except Exception as e:
                self.failures += 1
                delay = self.retry_delay_s
                if _is_connection_error(e):
                    log.info("%s: ZooKeeper unavailable (%r), retrying", self.name, e)
                elif hasattr(e, "retriable"):  # our own errors: the message says it all
                    log.error("%s: %s (retrying in %g s)", self.name, e, delay)
                else:
                    log.exception("%s: refresh failed, retrying in %g s", self.name, delay)
            finally:
                self.runs += 1


def _is_connection_error(e: BaseException) -> bool:
    try:
        from kazoo.exceptions import ConnectionLoss, SessionExpiredError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, ConnectionLoss | SessionExpiredError | ClusterUnavailable)


def wait_for(pred: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``pred`` until true or ``timeout`` s pass (for blocking ``wait_*`` helpers)."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
