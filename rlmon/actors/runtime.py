"""Finding or starting rlmon's actors on a Ray cluster, and the Reporter's Ray sink.

Actors are named in the namespace given to the Reporter (``rlmon`` by default): the service
``rlmon-service`` and one aggregator per shard, ``rlmon-aggregator-<i>``. A (run, role) always
maps to the same shard. ``get_if_exists`` makes concurrent starts from many ranks race-free.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlmon.actors.aggregator_actor import aggregator_actor_class
from rlmon.actors.reporter import outcome
from rlmon.actors.reporter.sink import SinkClosed, close_open_senders
from rlmon.actors.service_actor import SERVICE, service_actor_class
from rlmon.service.aggregation.tier_messages import IngestAck
from rlmon.service.contract.heartbeat import Heartbeat
from rlmon.service.contract.step_message import StepMessage

if TYPE_CHECKING:
    from rlmon.service.config import Settings

__all__ = [
    "AGGREGATOR",
    "SERVICE",
    "RaySink",
    "Runtime",
    "RuntimeGone",
    "RuntimeOptions",
    "aggregator_name",
    "before_exit_flush",
    "default_state_dir",
    "ensure_runtime",
    "metrics_url",
    "node_merger",
    "runtime_of",
    "shard_of",
    "shutdown_runtime",
]

AGGREGATOR = "rlmon-aggregator"
log = logging.getLogger(__name__)


def aggregator_name(shard: int) -> str:
    return f"{AGGREGATOR}-{shard}"


def shard_of(run: str, role: str, shards: int) -> int:
    """The aggregator shard of a (run, role): stable across processes and restarts."""
    return zlib.crc32(f"{run}\0{role}".encode()) % max(shards, 1)


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How to start the service and aggregators when none are running (embedded defaults).

    Every field reaches the actors however they are started (first Reporter, ``ensure_runtime``,
    ``rlmon serve``); a runtime already running keeps the options it was started with.
    """

    config: str | None = None  # YAML file (notifiers, routing, exporter, outbox)
    rules: str | None = None
    state_dir: str | None = None  # default: RLMON_STATE_DIR, else default_state_dir(namespace)
    port: int | None = None  # exporter port; None: RLMON_PORT, else the config's (9464)
    host: str | None = None  # exporter address; None: RLMON_HOST, else the config's (127.0.0.1)
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

    def resolved_port(self) -> int | None:
        if self.port is not None:
            return self.port
        env = os.environ.get("RLMON_PORT")
        return int(env) if env else None

    def resolved_host(self) -> str | None:
        return self.host or os.environ.get("RLMON_HOST") or None


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


@dataclass(slots=True)
class Runtime:
    """The handles this process holds on one namespace's service and aggregators.

    Kept in :data:`_RUNTIMES` for the life of the process and never replaced: a non-detached
    actor lives while its creator holds the handle it got at creation, so dropping or
    overwriting that handle would kill the actor under every other Reporter of the process.
    """

    namespace: str
    service: Any
    aggregators: list[Any]
    port: int | None
    host: str | None
    owned: bool  # this process started the service: it shuts the runtime down at exit
    detached: bool
    node_mergers: dict[str, Any] = field(default_factory=dict)


_LOCK = threading.RLock()
_RUNTIMES: dict[str, Runtime] = {}
_PROCESS = uuid.uuid4().hex  # who started a service: the owner shuts it down at exit
_state: dict[str, object] = {"exiting": False, "hooked": False, "unreachable": ""}
_EXITING = threading.Event()  # set at interpreter exit: a Ray start in progress gives up


class RuntimeGone(SinkClosed):
    """Ray was shut down (or the interpreter is exiting): rlmon will not start it again."""


def _in_ray_worker() -> bool:
    import ray

    return bool(ray.get_runtime_context().worker.mode == ray.WORKER_MODE)


def ray_address(explicit: str | None = None) -> tuple[str, str]:
    """(address for ``ray.init``, where it came from). Without ``RAY_ADDRESS`` or an explicit
    address, rlmon starts a Ray of its own ("local"): Ray's default would join whatever cluster
    its current-cluster file names, a ``ray start`` the user never asked rlmon to join, and a
    dead one left that file behind."""
    if explicit:
        return explicit, "the address given to rlmon"
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env, "RAY_ADDRESS"
    return "local", "a local Ray of rlmon's own"


def _connect_timeout() -> float:
    return float(os.environ.get("RLMON_RAY_CONNECT_TIMEOUT", "120"))


def _connect_ray(namespace: str, address: str | None = None) -> None:
    """Start a local Ray when none is connected, unless this process already had one: a second
    local Ray started after the user's (or Ray's exit hook's) ``ray.shutdown()`` would outlive
    the script and, at interpreter exit, crash beside libraries such as vLLM.

    From any thread (a Reporter's sender, or ``ensure_runtime`` called by the script), the wait
    is bounded by ``RLMON_RAY_CONNECT_TIMEOUT`` (120 s) and by the interpreter's exit: a Ray that
    cannot be reached is said once, in rlmon's words, and never holds the process."""
    import ray

    if _state["exiting"]:
        raise RuntimeGone("the interpreter is exiting")
    if ray.is_initialized():
        return
    if _RUNTIMES:
        raise RuntimeGone("Ray was shut down in this process; rlmon does not restart it")
    if _state.get("unreachable"):
        raise RuntimeGone(str(_state["unreachable"]))
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    target, source = ray_address(address)
    # A driver's SIGTERM runs the exit flush before the process dies of it (what ray.init's own
    # handler would do on the main thread; the keeper thread below cannot install one). Chained,
    # never over a handler of the user's: rlmon.actors.reporter.outcome
    outcome.install()
    if target == "local":
        _state["local_ray"] = True  # rlmon starts this Ray: the exit stops it whole
    # Ray's local processes get SIGKILL when the *thread* that started them ends
    # (PR_SET_PDEATHSIG), and a Reporter's sender thread ends when the Reporter closes: start
    # Ray on a daemon thread that lives as long as the process. Waiting for it there bounds the
    # wait on every thread: ray.init itself retries an unreachable address for minutes.
    started = threading.Event()
    failure: list[BaseException] = []

    def keep() -> None:
        try:
            ray.init(address=target, namespace=namespace, include_dashboard=False,
                     log_to_driver=True)
        except BaseException as exc:
            failure.append(exc)
            return
        finally:
            started.set()
        threading.Event().wait()

    threading.Thread(target=keep, name="rlmon-ray", daemon=True).start()
    deadline = time.monotonic() + _connect_timeout()
    while not started.wait(0.1):
        if _EXITING.is_set() or time.monotonic() > deadline:
            break
    if started.is_set() and not failure:
        return
    # said once, by the Reporter that asked (it names its run and what it could not send)
    text = _not_connected(target, source, failure[0] if failure else None, _EXITING.is_set())
    _state["unreachable"] = text
    raise RuntimeGone(text)


def _not_connected(target: str, source: str, failure: BaseException | None,
                   at_exit: bool) -> str:
    """Why this process's metrics are not delivered, and what to do, in rlmon's words."""
    where = (f"could not start {source}" if target == "local"
             else f"could not reach the Ray cluster at {target} (from {source})")
    why = (f"{type(failure).__name__}: {failure}" if failure is not None else
           "no answer within " + ("the exit budget (RLMON_EXIT_TIMEOUT)" if at_exit
                                  else f"{_connect_timeout():g}s (RLMON_RAY_CONNECT_TIMEOUT)"))
    advice = ("Raise RLMON_EXIT_TIMEOUT, or call flush() before the script ends"
              if target == "local" and at_exit and failure is None else
              "Ray's logs in its session directory (under RAY_TMPDIR, /tmp/ray by default) say why"
              if target == "local" else
              "Unset RAY_ADDRESS to let rlmon start its own Ray, or start the cluster it names")
    return f"{where}: {why}; this process's metrics are not delivered. {advice}"


def _hook_exit() -> None:
    """Flush at interpreter exit while Ray is still up: Reporters send what they hold (waiting
    for Ray's start-up if the script was shorter), an owned runtime finalizes its open steps and
    delivers its alerts. ``threading._register_atexit`` hooks run when the main thread ends,
    before every ``atexit`` hook, Ray's ``shutdown`` among them (concurrent.futures uses it the
    same way); ``atexit`` is the fallback."""
    with _LOCK:
        if _state["hooked"]:
            return
        _state["hooked"] = True
    # Once the interpreter's shutdown has begun, threading refuses new _register_atexit hooks,
    # and importing concurrent.futures.thread registers one: a script that exits straight after
    # its last end_step has Ray imported by this exit flush, and `import ray` (through urllib3)
    # failed there with "can't register atexit after shutdown", losing every step. Imported
    # now, while the Reporter starts (a few milliseconds, stdlib only), it is already loaded.
    import concurrent.futures.thread  # noqa: F401
    register = getattr(threading, "_register_atexit", None)
    outcome.exit_flush(_at_exit)  # what a SIGTERM runs before the process dies of it
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_at_exit)
    except RuntimeError:
        atexit.register(_at_exit)


_BEFORE_EXIT_FLUSH: list[Callable[[], None]] = []


def before_exit_flush(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit before Reporters flush (an integration's last window,
    such as vLLM's open step, must reach its Reporter first). A failure is logged, not raised."""
    _hook_exit()
    with _LOCK:
        if callback not in _BEFORE_EXIT_FLUSH:
            _BEFORE_EXIT_FLUSH.append(callback)


_FLUSHED = threading.Lock()  # held for good by the first exit flush: it runs once


def _at_exit() -> None:
    """The exit flush, within ``RLMON_EXIT_TIMEOUT`` whatever Ray does (starting, shut down by
    the user, unreachable): Reporters send what they hold (waiting for Ray's start-up if the
    script was shorter), an owned runtime finalizes its open steps and delivers its alerts, and
    a local Ray that rlmon started is stopped whole (rlmon.actors.local_ray). Every wait is
    bounded by one deadline; a part the budget did not reach is said, never waited for."""
    if not _FLUSHED.acquire(blocking=False):
        return
    deadline = time.monotonic() + outcome.exit_budget()

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    for callback in list(_BEFORE_EXIT_FLUSH):
        try:
            callback()
        except Exception as exc:  # never turn a clean exit into a traceback, but say it
            log.warning("rlmon: exit callback %s failed: %s", callback, exc)
    local = bool(_state.get("local_ray"))
    # Stopping a local Ray takes a moment (killing and reaping its processes): kept from the
    # Reporters' share of the budget, so that the stop is inside it too
    senders_until = deadline - (min(_STOP_RESERVE_S, outcome.exit_budget() / 4) if local else 0.0)
    # a script shorter than Ray's start-up still gets every step through: wait for it, within
    # the budget; at the budget's end (not after each sender's join) a sender still waiting for
    # Ray's start-up gives up, and so does the start itself (releasing _LOCK)
    out_of_budget = threading.Timer(max(0.0, senders_until - time.monotonic()), _EXITING.set)
    out_of_budget.daemon = True
    out_of_budget.start()
    close_open_senders(timeout=max(0.0, senders_until - time.monotonic()))
    out_of_budget.cancel()
    _EXITING.set()
    owned: list[str] = []
    if _LOCK.acquire(timeout=left()):
        try:
            _state["exiting"] = True
            owned = [rt.namespace for rt in _RUNTIMES.values() if rt.owned and not rt.detached]
        finally:
            _LOCK.release()
    else:
        log.warning("rlmon: the runtime is still busy at exit; not waiting for it")
    for namespace in owned:
        try:
            shutdown_runtime(namespace, timeout=min(10.0, left()), deadline=deadline)
        except Exception as exc:  # never let rlmon turn a clean exit into a traceback
            log.warning("rlmon: shutting down namespace %r at exit failed: %s", namespace, exc)
    if local:
        from rlmon.actors.local_ray import stop_local_ray

        try:
            alive = stop_local_ray(max(deadline, time.monotonic() + _STOP_MIN_S))
        except Exception as exc:
            log.warning("rlmon: stopping the local Ray at exit failed: %s", exc)
        else:
            if alive:
                log.warning("rlmon: the local Ray's processes %s were still stopping when the "
                            "exit budget (RLMON_EXIT_TIMEOUT) ran out", ", ".join(alive))


_STOP_RESERVE_S = 1.0  # of the exit budget, kept for stopping a local Ray rlmon started
_STOP_MIN_S = 0.2  # ... and at least this, even when the budget is spent: SIGKILL and a reap


def _get_actor(name: str, namespace: str) -> Any:
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def ensure_runtime(namespace: str = "rlmon", options: RuntimeOptions | None = None) -> Any:
    """The service handle; starts the service and its aggregators when they are not running.

    Any number of calls, from any number of Reporters of a process, share one runtime per
    namespace (see :class:`Runtime`). Started from a driver, the actors live as long as that
    driver (or for ever with ``detached``), and the driver finalizes and delivers everything at
    exit. Started from inside a Ray worker (a Reporter in a policy rank), they are detached, so
    the death of that one rank does not take monitoring down with it.
    """
    import ray

    with _LOCK:
        known = _RUNTIMES.get(namespace)
        if known is not None:
            return known.service
        opts = options or RuntimeOptions()
        resolved: list[Settings] = []

        def settings() -> Settings:
            # resolved when something is started (or the caller gave them): a Reporter joining
            # a running service never needs its own process's settings
            if not resolved:
                resolved.append(opts.resolved_settings())
            return resolved[0]

        _connect_ray(namespace, opts.address)
        _hook_exit()
        detached = opts.detached or _in_ray_worker()
        lifetime = "detached" if detached else None
        state_dir = opts.resolved_state_dir(namespace)
        service = _get_actor(SERVICE, namespace)
        cls = aggregator_actor_class()
        aggregators: list[Any] = []

        def start_aggregators(shards: int) -> None:
            for shard in range(len(aggregators), shards):
                agg = _get_actor(aggregator_name(shard), namespace)
                if agg is None:
                    agg = cls.options(
                        name=aggregator_name(shard), namespace=namespace, get_if_exists=True,
                        lifetime=lifetime, max_restarts=opts.max_restarts,
                    ).remote(namespace, SERVICE, shard, state_dir, opts.deadline_s, opts.tick_s,
                             settings().liveness.params())
                aggregators.append(agg)

        if service is None:
            extra: dict[str, Any] = {}
            if opts.service_resource:
                extra["resources"] = {opts.service_resource: 1.0}
            service = service_actor_class().options(
                name=SERVICE, namespace=namespace, get_if_exists=True, lifetime=lifetime,
                max_restarts=opts.max_restarts, **extra,
            ).remote(settings(), state_dir, opts.resolved_port(), opts.resolved_host(),
                     opts.shards, opts.rules, _PROCESS)
            # the aggregators' workers start beside the service's, not after it is up (each
            # worker's start-up is seconds on a busy machine; one after the other doubled it)
            start_aggregators(opts.shards)
        layout: Any = ray.get(service.layout.remote())
        if opts.settings is not None and layout.get("creator") != _PROCESS and not ray.get(
                service.settings_match.remote(settings())):
            raise RuntimeError(
                f"an rlmon service already runs in namespace {namespace!r} with other settings "
                "(token, public_url, notifiers, ...): its settings cannot be changed in place; "
                "stop it first, or start this one in another namespace")
        start_aggregators(int(layout["shards"]))  # a service found running says how many
        del aggregators[int(layout["shards"]):]
        # the aggregators up before the first send: a call to one whose worker is still starting
        # (seconds on a busy machine) would time out and be resent, with a misleading last error
        ray.get([agg.__ray_ready__.remote() for agg in aggregators])
        owned = layout.get("creator") == _PROCESS
        runtime = _RUNTIMES[namespace] = Runtime(
            namespace, service, aggregators, layout.get("port"), layout.get("host"), owned,
            detached)
        if owned:
            _announce(runtime, layout)
            if not _in_ray_worker():
                # A Ray worker's output reaches the driver through Ray's lagging forwarding and
                # is lost when Ray stops first: there the lines wait for shutdown_runtime, which
                # the driver calls before its ray.shutdown() and which prints them itself.
                threading.Thread(target=_relay_console, args=(runtime,), daemon=True,
                                 name="rlmon-console").start()
        return service


def runtime_of(namespace: str) -> Runtime | None:
    """The runtime this process holds for ``namespace``, if any."""
    with _LOCK:
        return _RUNTIMES.get(namespace)


def metrics_url(namespace: str = "rlmon", timeout: float = 10.0) -> str | None:
    """Where the namespace's ``/metrics`` is served; None when no service runs (this process
    connected to Ray and none was found) or its exporter is disabled."""
    runtime = runtime_of(namespace)
    if runtime is not None:
        port, host = runtime.port, runtime.host
    else:
        import ray

        service = _get_actor(SERVICE, namespace) if ray.is_initialized() else None
        if service is None:
            return None
        layout: Any = ray.get(service.layout.remote(), timeout=timeout)
        port, host = layout.get("port"), layout.get("host")
    return None if port is None else f"http://{host}:{port}/metrics"


def _announce(runtime: Runtime, layout: Mapping[str, Any]) -> None:
    """Say once, in the process that started the service, where to look."""
    port = layout.get("port")
    where = (f"/metrics on http://{layout.get('host')}:{port}/metrics, the run page on "
             f"http://{layout.get('host')}:{port}/" if port is not None
             else "no /metrics (exporter disabled)")
    moved = f" (port {layout['wanted_port']} was taken)" if layout.get("port_moved") else ""
    alerts = ", ".join(layout.get("destinations") or ["nowhere"])
    print(f"rlmon: service started in namespace {runtime.namespace!r}: {where}{moved}; "
          f"alerts to {alerts}; state in {layout.get('state_dir')}; Ray at {_gcs_address()}",
          file=sys.stderr, flush=True)


def _gcs_address() -> str:
    import ray

    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an older Ray, or a client connection: say what is known
        return os.environ.get("RAY_ADDRESS") or "unknown"


_SAID_SERVICE: set[str] = set()


def _say_service(namespace: str, layout: Mapping[str, Any]) -> None:
    """A driver that joined a service another process started says once where its metrics go
    (RAY_ADDRESS=auto joins the newest Ray on the machine: it may be another user's rlmon)."""
    if namespace in _SAID_SERVICE or layout.get("creator") == _PROCESS or _in_ray_worker():
        return
    _SAID_SERVICE.add(namespace)
    port = layout.get("port")
    page = (f"the run page on http://{layout.get('host')}:{port}/" if port is not None
            else "no run page (exporter disabled)")
    print(f"rlmon: reporting to the rlmon service in namespace {namespace!r} on the Ray at "
          f"{_gcs_address()}: {page}; state in {layout.get('state_dir')}", file=sys.stderr,
          flush=True)


def _print_console(service: Any, timeout: float = 10.0) -> None:
    import ray

    lines: list[str] = ray.get(service.take_console.remote(), timeout=timeout)
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)


def _relay_console(runtime: Runtime, period: float = 0.2) -> None:
    """Print the service's console alerts here, in the process that started it, while it runs."""
    import ray

    stop = threading.Event()
    while runtime_of(runtime.namespace) is runtime and not stop.wait(period):
        if not ray.is_initialized():
            return  # the job shut Ray down; nothing is left to relay from
        try:
            _print_console(runtime.service)
        except Exception:  # the service restarting, or shut down under us: try again
            continue


def node_merger(namespace: str, shard: int, options: RuntimeOptions) -> Any:
    """The node merger of this node for one aggregator shard (started on this node if missing)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rlmon.actors.node_merger import node_merger_actor_class

    node = ray.get_runtime_context().get_node_id()
    name = f"rlmon-node-merger-{shard}-{node[:16]}"
    with _LOCK:
        runtime = _RUNTIMES[namespace]
        handle = runtime.node_mergers.get(name) or _get_actor(name, namespace)
        if handle is None:
            handle = node_merger_actor_class().options(
                name=name, namespace=namespace, get_if_exists=True,
                lifetime="detached" if runtime.detached else None,
                max_restarts=options.max_restarts,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(namespace, aggregator_name(shard), options.tick_s)
        runtime.node_mergers[name] = handle
        return handle


class RaySink:
    """Sends step messages to the aggregator shard of their (run, role) and waits for the ack.

    It runs on the Reporter's sender thread, never on the training thread: the first send starts
    (or finds) Ray and the runtime there, so creating a Reporter and recording never wait for
    Ray. A failed call (the actor restarting or gone) raises, the Reporter keeps the messages,
    and the next call looks the actor up again. :class:`RuntimeGone` means Ray was shut down
    for good in this process.

    It lives here rather than beside the sink protocol and the Ray-free sinks
    (:mod:`rlmon.actors.reporter.sink`) because it imports Ray and drives this runtime; the
    Reporter imports it only when no sink is given.
    """

    def __init__(
        self, namespace: str = "rlmon", *, start_service: bool = True,
        options: RuntimeOptions | None = None, timeout: float = 10.0,
    ) -> None:
        self.namespace, self.start_service = namespace, start_service
        self.options, self.timeout = options, timeout
        self._handles: dict[int, Any] = {}
        self._shards: int | None = None
        self._lock = threading.Lock()
        self._calls: list[tuple[str, tuple[Any, ...]]] = []  # service calls made before connect
        self._service: Any = None
        self.last_ack: IngestAck | None = None
        _hook_exit()

    def _connect(self) -> None:
        """Find (or start) the runtime; called with the lock held, on the sender thread."""
        if self._shards is not None:
            _connect_ray(self.namespace)  # raises RuntimeGone after a shutdown
            return
        import ray

        if self.start_service:
            self._service = ensure_runtime(self.namespace, self.options)
        else:
            _connect_ray(self.namespace)
            self._service = ray.get_actor(SERVICE, namespace=self.namespace)
        layout: Any = ray.get(self._service.layout.remote(), timeout=self.timeout)
        self._shards = int(layout["shards"])
        _say_service(self.namespace, layout)
        calls, self._calls = self._calls, []
        for method, args in calls:
            getattr(self._service, method).remote(*args)

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The sink's lock, waited for no longer than a call: a call stuck inside Ray (one in
        flight when the user's ray.shutdown() tore the worker down) must not hold the next
        caller for ever; at exit, the closing heartbeat waited on it, and the process never
        exited."""
        if not self._lock.acquire(timeout=self.timeout):
            raise TimeoutError(f"an earlier call to Ray is still in progress after "
                               f"{self.timeout:g}s")
        try:
            yield
        finally:
            self._lock.release()

    def undelivered(self) -> str | None:
        """Why messages are still held when the Reporter closes, when the sink knows better than
        its last error: Ray was still starting (or being reached) as the exit budget ran out."""
        if self._shards is not None or not _FLUSHED.locked():  # not in the exit flush
            return None
        initialized = getattr(sys.modules.get("ray"), "is_initialized", None)  # maybe mid-import
        if initialized is not None and initialized():
            return None
        target, source = ray_address(self.options.address if self.options else None)
        return _not_connected(target, source, None, at_exit=True)

    def call_service(self, method: str, *args: Any) -> None:
        """Call a service method without waiting; before the first send it is queued, so the
        training thread never starts Ray."""
        with self._lock:
            if self._service is None:
                self._calls.append((method, args))
                return
            service = self._service
        getattr(service, method).remote(*args)

    def _handle(self, shard: int) -> Any:
        handle = self._handles.get(shard)
        if handle is None:
            if self.options is not None and self.options.node_merge:
                handle = self._handles[shard] = node_merger(
                    self.namespace, shard, self.options)
            else:
                import ray

                handle = self._handles[shard] = ray.get_actor(
                    aggregator_name(shard), namespace=self.namespace)
        return handle

    def probe(self, run: str, role: str) -> IngestAck | None:
        """The incarnation and floor of the aggregator (or node merger) serving (run, role)."""
        import ray

        with self._held():
            self._connect()
            assert self._shards is not None
            shard = shard_of(run, role, self._shards)
            try:
                ack: IngestAck = ray.get(
                    self._handle(shard).probe.remote(run, role), timeout=self.timeout)
            except Exception:
                self._handles.pop(shard, None)
                raise
            return ack

    def heartbeat(self, beats: Sequence[Heartbeat]) -> None:
        """Heartbeats sent alone, to the aggregator shard of each (run, role) (a node merger
        is bypassed: liveness is judged by the root)."""
        import ray

        with self._held():
            self._connect()
            assert self._shards is not None
            by_shard: dict[int, list[Heartbeat]] = {}
            for beat in beats:
                by_shard.setdefault(shard_of(beat.run, beat.role, self._shards), []).append(beat)
            for shard, batch in by_shard.items():
                handle = ray.get_actor(aggregator_name(shard), namespace=self.namespace)
                ray.get(handle.heartbeat.remote(batch), timeout=self.timeout)

    def send(self, messages: Sequence[StepMessage]) -> IngestAck | None:
        import ray

        with self._held():
            self._connect()
            assert self._shards is not None
            by_shard: dict[int, list[StepMessage]] = {}
            for msg in messages:
                by_shard.setdefault(shard_of(msg.run, msg.role, self._shards), []).append(msg)
            for shard, batch in by_shard.items():
                try:
                    self.last_ack = ray.get(
                        self._handle(shard).ingest.remote(batch), timeout=self.timeout)
                except Exception:
                    self._handles.pop(shard, None)
                    raise
            return self.last_ack


def shutdown_runtime(namespace: str = "rlmon", timeout: float = 10.0, kill: bool = True,
                     deadline: float | None = None) -> bool:
    """Graceful stop: aggregators finalize and deliver, the service drains its outbox; then kill.

    ``deadline`` (monotonic) bounds every wait (the exit flush's budget). Returns whether
    everything was delivered in time.
    """
    import ray

    def cap(wait: float) -> float:
        return wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic()))

    if not ray.is_initialized():
        return False
    with _LOCK:
        runtime = _RUNTIMES.pop(namespace, None)
    ok = True
    try:
        service = runtime.service if runtime is not None else ray.get_actor(
            SERVICE, namespace=namespace)
        layout: Any = ray.get(service.layout.remote(), timeout=cap(timeout))
        shards = int(layout["shards"])
    except Exception:
        return False
    for handle in (runtime.node_mergers.values() if runtime is not None else ()):
        try:  # hand the node merger's pre-merged states to the root first
            ray.get(handle.flush.remote(), timeout=cap(timeout))
        except Exception:
            ok = False
        if kill:
            ray.kill(handle, no_restart=True)
    for shard in range(shards):
        agg = runtime.aggregators[shard] if runtime is not None and shard < len(
            runtime.aggregators) else _get_actor(aggregator_name(shard), namespace)
        if agg is None:
            continue
        try:  # its close publishes (10 s bound) and joins its thread (5 s) inside this wait
            ok = bool(ray.get(agg.close.remote(), timeout=cap(timeout + 20))) and ok
        except Exception:
            ok = False
        if kill:
            ray.kill(agg, no_restart=True)
    try:
        ok = bool(ray.get(service.close.remote(timeout), timeout=cap(timeout + 5))) and ok
        _print_console(service, cap(timeout))  # the alerts of the last steps, before Ray stops
    except Exception:
        ok = False
    if kill:
        ray.kill(service, no_restart=True)
    return ok
