"""The service's ports: the /metrics and run-page HTTP server with its cache warmer. Started by
:meth:`ServicePorts.start` (the service actor's or ``rlmon serve``'s ``start``), never by a
constructor."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from rlmon.service.alerting.rules import Rule
from rlmon.service.config import Settings
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import MetricsServer, serve_metrics
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.storage.history import HistoryStore
from rlmon.service.web.api import WebApi
from rlmon.service.web.server import CacheWarmer, HostCheck, WebApp

__all__ = ["ServicePorts"]

_log = logging.getLogger("rlmon.service")
_UNSAID = RunInfo().labels()  # a run's settings at these values were not reported


class ServicePorts:
    """``port`` None: no HTTP server; with ``port_fallback`` a taken port gives way to a free
    one (the embedded default), otherwise :meth:`start` raises naming it."""

    def __init__(
        self, settings: Settings, state: Path | None, port: int | None, host: str | None,
        port_fallback: bool, *, history: HistoryStore, metrics: MetricsState,
        rules: Sequence[Rule], ledger: GoodputLedger, run_info: Mapping[str, RunInfo],
        health: Callable[[], tuple[bool, str]],
    ) -> None:
        self.settings, self._state, self._fallback = settings, state, port_fallback
        self.wanted_port = port
        self.host = host or settings.exporter.host
        self._history, self._metrics, self._rules = history, metrics, list(rules)
        self._ledger, self._run_info, self._health = ledger, run_info, health
        self.server: MetricsServer | None = None
        self.warmer: CacheWarmer | None = None  # keeps the run page's curves read (a state dir)
        self._reader: HistoryStore | None = None

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None

    def start(self) -> None:
        """Serve /metrics and the run page on the wanted port (nothing without one)."""
        port = self.wanted_port
        if port is None or self.server is not None:
            return
        web = self._web_app()
        try:
            self.server = serve_metrics(self._metrics, port, self.host, health=self._health,
                                        web=web, hosts=web.hosts)
        except OSError as exc:
            if not self._fallback:
                raise OSError(exc.errno, f"rlmon: the requested port {port} on {self.host} "
                              f"is taken ({exc.strerror}); free it or ask for another "
                              "(--port, RLMON_PORT, exporter.port; 0 takes any free "
                              "port)") from exc
            _log.warning("rlmon: port %s on %s is taken (%s); serving /metrics on a free "
                         "port", port, self.host, exc)
            self.server = serve_metrics(self._metrics, 0, self.host, health=self._health,
                                        web=web, hosts=web.hosts)

    def _web_app(self) -> WebApp:
        """The run page (rlmon.service.web): it reads the history store through its own
        read-only connection, never under the lock the alert path writes with (an in-memory
        store, in tests, has only the one connection)."""
        state, reader = self._state, self._history
        if state is not None:
            reader = self._reader = HistoryStore(state / "history.sqlite", read_only=True)
        token = self.settings.exporter.token
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback and token is None:
            _log.warning("rlmon: the run page and /api/ on %s are open to whoever reaches it "
                         "(worst samples included): set exporter.token_file or "
                         "RLMON_EXPORTER__TOKEN (docs/page.md)", self.host)
        ledger, run_info = self._ledger, self._run_info
        api = WebApi(reader, self._rules, states=self._metrics.liveness_states,
                     goodput=lambda: {run: g for run, (_s, g, _m) in
                                      ledger.snapshot().items()},
                     run_info=lambda: {run: {k: v for k, v in labels.items()
                                             if v != _UNSAID.get(k)}
                                       for run, labels in {**reader.run_infos(), **{
                                           r: i.labels() for r, i in dict(run_info).items()}
                                       }.items()},
                     gpus=ledger.run_gpus, price=ledger.price)
        if state is not None:
            warmer = self.warmer = CacheWarmer(api)
            warmer.start()
        public = urlsplit(self.settings.run_page() or "").hostname
        hosts = HostCheck(self.host, [*self.settings.exporter.allowed_hosts,
                                      *([public] if public else [])])
        return WebApp(api, token.get_secret_value() if token is not None else None, hosts)

    def close(self) -> None:
        """Stop serving; close the run page's connection."""
        if self.server is not None:
            self.server.close()
            self.server = None
        warmer, self.warmer = self.warmer, None
        if warmer is not None:
            warmer.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
