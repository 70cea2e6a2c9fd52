"""The broker's HTTP port (``dashboardHttpPort``): Prometheus ``/metrics`` and the dashboard.

:func:`start_dashboard` runs on the broker's event loop once the broker listens: it starts the
rate sampler and the HTTP server (:mod:`~pymetaq.server.http.server`) with the application
(:mod:`~pymetaq.server.http.app`), bound to ``dashboardHttpHost`` (loopback by default).
``dashboardHttpPort=0`` turns all of it off (and ``prometheus_client`` is never imported).
A port that cannot be bound stops the start, with the reason, like ``serverPort``.

Thread-safety: loop thread only.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from pymetaq.server.errors import StartupError

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker
    from pymetaq.server.dispatch import Dispatcher
    from pymetaq.server.http.server import HttpServer
    from pymetaq.server.monitor.rates import RateSampler

log = logging.getLogger("pymetaq.server")


class Dashboard:
    """The running HTTP port: its server and its rate sampler."""

    def __init__(self, server: HttpServer, rates: RateSampler) -> None:
        self.server = server
        self.rates = rates

    @property
    def port(self) -> int:
        return self.server.port

    async def close(self) -> None:
        self.rates.stop()
        await self.server.close()


async def start_dashboard(broker: Broker, dispatcher: Dispatcher) -> Dashboard | None:
    """Start the HTTP port (None when ``dashboardHttpPort=0``); raises :class:`StartupError`."""
    import asyncio

    from pymetaq.server.http.app import DashboardApp
    from pymetaq.server.http.server import HttpServer
    from pymetaq.server.monitor import views
    from pymetaq.server.monitor.rates import RateSampler

    system = broker.config.system
    if system.dashboard_http_port == 0:
        return None
    loop = asyncio.get_running_loop()
    rates = RateSampler(loop, lambda: views.totals(broker, dispatcher))
    app = DashboardApp(broker, dispatcher, rates)
    security = broker.config.security
    gate = None
    if security.enable:
        from pymetaq.server.security.http import HttpGate

        gate = HttpGate(dispatcher.guard)
    ctx = None
    if security.http_tls:
        from pymetaq.server.security.tls import server_context

        ctx = server_context(security)
    server = HttpServer(
        app, system.dashboard_http_host, system.dashboard_http_port, ssl=ctx, gate=gate
    )
    try:
        await server.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise StartupError(
            f"cannot listen on {system.dashboard_http_host}:{system.dashboard_http_port} for the "
            f"dashboard and /metrics: {reason} (set dashboardHttpPort to a free port, or 0 to "
            "turn the HTTP port off)"
        ) from exc
    rates.start()
    scheme = "https" if ctx is not None else "http"
    log.info(
        "dashboard and /metrics on %s://%s:%d/%s",
        scheme,
        system.dashboard_http_host,
        server.port,
        " (admin identities only)" if gate is not None else "",
    )
    return Dashboard(server, rates)
