"""How to start the service and its aggregators when none are running, and where their state lives."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlmon.service.config import Settings

__all__ = ["RuntimeOptions", "default_state_dir"]


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How to start the service and aggregators when none are running (embedded defaults).

    Every field reaches the actors however they are started (first Reporter, ``ensure_runtime``,
    ``rlmon serve``); a runtime already running keeps the options it was started with.
    """

    config: str | None = None  # YAML file (notifiers, routing, exporter, outbox)
    rules: str | None = None
    state_dir: str | None = None  # default: RLMON_STATE_DIR, else default_state_dir(namespace)
    port: int | None = None  # exporter port; None: the settings' exporter.port (9464)
    host: str | None = None  # exporter address; None: the settings' exporter.host (127.0.0.1)
    shards: int = 1
    detached: bool = False
    max_restarts: int = -1
    deadline_s: float | None = None  # None: derived from the observed step period
    tick_s: float = 0.02
    node_merge: bool = False  # Reporters send to a per-node merger that pre-merges
    service_resource: str | None = None  # place the service on the node offering this resource
    address: str | None = None  # Ray to join; None: RAY_ADDRESS, else a local Ray of rlmon's own
    # the settings resolved once where the service is started (file, environment, flags);
    # None: resolved from ``config`` and this process's environment when the service starts.
    # Given, they must match a service already running (else a start-up error)
    settings: Settings | None = field(default=None, repr=False, compare=False)

    def resolved_settings(self) -> Settings:
        """The service's settings, resolved here (a bad config is a ConfigError here, not a
        default in an actor): what the actors get, wherever Ray places them."""
        from rlmon.service.config import load_config

        return self.settings if self.settings is not None else load_config(self.config)

    def resolved_state_dir(self, namespace: str) -> str:
        return self.state_dir or os.environ.get("RLMON_STATE_DIR") or default_state_dir(namespace)


def default_state_dir(namespace: str) -> str:
    """A per-user, private (0700) directory: ``$XDG_STATE_HOME/rlmon/<namespace>`` (default
    ``~/.local/state``), never a shared, guessable path under /tmp that another user could plant
    files in. Without a usable home, a fresh ``mkdtemp`` directory (the state is then ephemeral).
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", namespace).strip(".") or "_"
    path = os.path.join(base, "rlmon", safe)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid():
            raise PermissionError(f"{path} belongs to another user")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    except OSError:
        return tempfile.mkdtemp(prefix=f"rlmon-{namespace}-")
