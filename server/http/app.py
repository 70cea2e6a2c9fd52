"""The broker's HTTP application: ``/metrics``, the dashboard pages, their JSON and static files.

| route                      | answer                                                         |
|----------------------------|----------------------------------------------------------------|
| GET ``/metrics``           | Prometheus text format 0.0.4, or OpenMetrics if ``Accept``-ed  |
| GET ``/``                  | overview                                                       |
| GET ``/topics``, ``/topics/<topic>`` | topics with partitions and rates; one topic          |
| GET ``/groups``            | consumer groups with live lag per partition                    |
| GET ``/config``            | the config file and the reload button                          |
| POST ``/reload-config``    | reload (MetaQ's route); guarded, then ``303`` to ``/config``    |
| GET ``/stats``, ``/stats/<item>`` | MetaQ's ``stats <item>`` text                           |
| GET ``/threads``           | every thread's stack (MetaQ's ``/thread-dump``)                |
| GET ``/dashboard``, ``/cluster``, ``/thread-dump`` | MetaQ's routes: the overview, the threads |
| GET ``/api/overview``, ``/api/topics``, ``/api/groups`` | JSON behind the pages' live numbers |
| GET ``/static/<file>``     | ``dashboard.css``, ``dashboard.js``, ``favicon.svg`` (package data) |

The reload is a state change, so it is guarded three ways: the peer must be a loopback address
(with ``[security] enable=true``: an admin identity instead, checked by the gate of
:mod:`pymetaq.server.security.http` before any route; the config page's secrets are redacted
either way), the form must carry the page's CSRF token (random
per broker process, compared in constant time), and a browser's ``Origin`` (or
``Sec-Fetch-Site``) must say the request comes from the dashboard itself.  Refusals are
``403`` with the reason.

Thread-safety: called on the broker's loop thread by :mod:`pymetaq.server.http.server`.
"""

from __future__ import annotations

import hmac
import importlib.resources
import json
import secrets
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client.exposition import choose_encoder

from pymetaq.server.http import pages
from pymetaq.server.http.server import Request, Response
from pymetaq.server.monitor import views
from pymetaq.server.monitor.metrics import registry_for
from pymetaq.server.monitor.ops import is_loopback
from pymetaq.server.monitor.rates import RateSampler
from pymetaq.server.security.config import redact

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker
    from pymetaq.server.dispatch import Dispatcher

HTML = "text/html; charset=utf-8"
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _static(name: str) -> bytes:
    return importlib.resources.files("pymetaq.server.http").joinpath("static", name).read_bytes()


class DashboardApp:
    """Routes requests to the pages, the JSON, ``/metrics`` and the reload."""

    #: ``[security] enable=true`` (the gate has checked an admin identity: no loopback rule)
    secured = False
    #: ``[security] httpTls=true`` (a browser's ``Origin`` is ``https://...``)
    https = False

    def __init__(self, broker: Broker, dispatcher: Dispatcher, rates: RateSampler) -> None:
        self.broker = broker
        self.dispatcher = dispatcher
        self.rates = rates
        self.registry = registry_for(broker, dispatcher)
        self.token = secrets.token_urlsafe(32)
        self.secured = broker.config.security.enable
        self.https = broker.config.security.http_tls
        self.last_reload = ""
        self._static = {name: _static(name) for name in STATIC}
        self._get: dict[str, Callable[[Request], Response]] = {
            "/": self._overview,
            "/topics": self._topics,
            "/groups": self._groups,
            "/config": self._config,
            "/stats": self._stats,
            "/threads": self._threads,
            "/metrics": self._metrics,
            # MetaQ's dashboard routes, for old bookmarks
            "/dashboard": self._overview,
            "/cluster": self._overview,
            "/thread-dump": self._threads,
            "/api/overview": lambda r: _json(self._ov()),
            "/api/topics": lambda r: _json(views.topics(broker, dispatcher, rates)),
            "/api/groups": lambda r: _json(views.groups(broker, dispatcher)),
        }

    def __call__(self, request: Request) -> Response:
        path = request.path
        if request.method == "POST":
            if path == "/reload-config":
                return self._reload(request)
            return Response(405, b"method not allowed\n", headers=[("Allow", "GET, HEAD")])
        handler = self._get.get(path.rstrip("/") or "/")
        if handler is not None:
            return handler(request)
        if path.startswith("/topics/"):
            return self._topic(path[len("/topics/") :])
        if path.startswith("/stats/"):
            return self._stats(request, path[len("/stats/") :])
        if path.startswith("/static/") and path[len("/static/") :] in STATIC:
            name = path[len("/static/") :]
            return Response(
                200, self._static[name], STATIC[name], [("Cache-Control", "max-age=60")]
            )
        return Response(404, b"not found\n")

    # -- pages --------------------------------------------------------------------------------
    def _ov(self) -> dict[str, Any]:
        return views.overview(self.broker, self.dispatcher, self.rates)

    def _overview(self, request: Request) -> Response:
        return Response(200, pages.overview_page(self._ov()), HTML)

    def _topics(self, request: Request) -> Response:
        topics = views.topics(self.broker, self.dispatcher, self.rates)
        return Response(200, pages.topics_page(self._ov(), topics), HTML)

    def _topic(self, name: str) -> Response:
        topics = views.topics(self.broker, self.dispatcher, self.rates)
        found = next((t for t in topics if t["topic"] == name), None)
        if found is None:
            return Response(404, b"no such topic\n")
        groups = views.groups(self.broker, self.dispatcher)
        return Response(200, pages.topic_page(self._ov(), found, groups), HTML)

    def _groups(self, request: Request) -> Response:
        groups = views.groups(self.broker, self.dispatcher)
        return Response(200, pages.groups_page(self._ov(), groups), HTML)

    def _config(self, request: Request) -> Response:
        text = redact(self.broker.config.text)
        body = pages.config_page(self._ov(), text, self.token, self.last_reload)
        return Response(200, body, HTML, [("Cache-Control", "no-store")])

    def _stats(self, request: Request, item: str = "") -> Response:
        if item == "reset":  # a GET must not change state
            return Response(403, b"stats reset is not served over HTTP: `pymetaq stats reset`\n")
        body = self.dispatcher.stats_body(item)
        if request.arg("format") == "text":
            return Response(200, body)
        items = ("", "topics", "offsets", "realtime", "lag", "help", "config")
        links = " · ".join(f'<a href="/stats/{i}">{i or "general"}</a>' for i in items)
        title = f"stats {item}".strip()
        text = body.decode("utf-8", "replace")
        return Response(
            200, pages.text_page(self._ov(), title, "/stats", text, f"<p>{links}</p>"), HTML
        )

    def _threads(self, request: Request) -> Response:
        names = {t.ident: t.name for t in threading.enumerate()}
        dump = []
        for ident, frame in sys._current_frames().items():
            dump.append(f'Thread "{names.get(ident, "?")}" ({ident}):')
            dump.extend(line.rstrip() for line in traceback.format_stack(frame))
            dump.append("")
        return Response(
            200, pages.text_page(self._ov(), "Threads", "/threads", "\n".join(dump)), HTML
        )

    def _metrics(self, request: Request) -> Response:
        """The text format (0.0.4), or OpenMetrics when the scraper asks for it."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(200, encoder(self.registry), content_type)

    # -- the guarded reload -------------------------------------------------------------------
    def _reload(self, request: Request) -> Response:
        why = self.refusal(request)
        if why is not None:
            return Response(403, why.encode() + b"\n")
        code, text = self.dispatcher.admin.run("reload", ())
        self.last_reload = ("Reloaded: " if code == 200 else "Reload failed: ") + text
        return Response(303, b"", headers=[("Location", "/config")])

    def refusal(self, request: Request) -> str | None:
        """Why a state-changing request must be refused, or None."""
        if not self.secured and not is_loopback(request.peer):  # else: the gate's admin
            return "the reload is allowed only from this host (a loopback address)"
        token = request.form().get("token", "") or request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return "missing or wrong CSRF token: use the button on /config"
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"cross-site request refused (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        scheme = "https" if self.https else "http"
        if origin is not None and origin != f"{scheme}://{host}":
            return f"cross-origin request refused (Origin: {origin})"
        return None


def _json(value: Any) -> Response:
    body = json.dumps(value, separators=(",", ":")).encode()
    return Response(200, body, "application/json", [("Cache-Control", "no-store")])
