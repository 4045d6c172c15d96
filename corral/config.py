"""``corral.toml``: every limit the host uses, with documented defaults.

The file is optional; every key has a default. Unknown keys and out-of-range values are
errors that name the key (``bus.hwm``), so a typo never silently falls back to a default.
See ``docs/config.md`` for the full reference.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

import msgspec

from ._exceptions import ConfigError

Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
RestartType = Literal["permanent", "transient", "temporary"]
S = TypeVar("S", bound=msgspec.Struct)


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A table of ``corral.toml``. Each subclass says ``frozen=True`` again: msgspec
    inherits it anyway, but a type checker reads each class's own keywords."""


class BusSettings(_Section, frozen=True):
    """The broker and its durable mailboxes."""

    #: Largest encoded message; bigger ones are refused with an error and dead-lettered.
    max_message_bytes: PositiveInt = 4 * 1024 * 1024
    #: ZeroMQ send/receive high-water marks (messages) on every socket.
    hwm: PositiveInt = 20_000
    #: How long a closing socket may keep flushing unsent messages, in milliseconds.
    linger_ms: Annotated[int, msgspec.Meta(ge=0)] = 200
    #: Deliveries of one durable message before it is dead-lettered.
    max_attempts: PositiveInt = 5
    #: Durable messages delivered to one actor but not yet acked, at most.
    inflight_window: PositiveInt = 256
    #: Extra time a group commit waits to gather more appends (0: only what queued up
    #: during the previous fsync).
    group_commit_window_ms: NonNegative = 0.0
    #: The log is compacted once it is this large and mostly dead.
    compact_min_bytes: PositiveInt = 16 * 1024 * 1024
    #: Dead letters kept (oldest dropped first).
    max_dead_letters: PositiveInt = 10_000
    #: Stream messages buffered in the broker for one slow peer before senders get errors.
    max_backlog: PositiveInt = 100_000
    #: Default deadline of a request/reply call, in seconds.
    request_timeout_s: Positive = 10.0
    #: A durable message delivered and unacked for longer than this shows as stuck in
    #: ``corral mailboxes``. Longer than any hold by design: a turn keeps its TurnStart in
    #: flight for its whole length, which dispatch's watchdog caps at ``turn_timeout_s``
    #: (3600 s by default).
    stuck_after_s: Positive = 3900.0


class LivenessSettings(_Section, frozen=True):
    """Heartbeats: a peer silent for ``interval_s * liveness`` is treated as dead."""

    interval_s: Positive = 1.0
    liveness: PositiveInt = 3


class SupervisorSettings(_Section, frozen=True):
    """Restart intensity (at most ``intensity`` restarts in ``period_s``) and shutdown."""

    intensity: Annotated[int, msgspec.Meta(ge=0)] = 5
    period_s: Positive = 10.0
    #: Time a child gets between SIGTERM and SIGKILL.
    shutdown_timeout_s: Positive = 5.0
    #: On SIGTERM (or ``stop``), how long the host waits for the turns in flight to end,
    #: starting no new one, before it stops its actors (0: stop at once). A unit's
    #: ``TimeoutStopSec=`` and a pod's ``terminationGracePeriodSeconds`` must cover it plus
    #: the actors' shutdown timeouts (docs/deploy.md).
    drain_timeout_s: NonNegative = 30.0
    #: Fork the actors from a zygote, a process that has imported them (:mod:`corral._zygote`):
    #: they share its pages instead of an interpreter each. False: exec each.
    zygote: bool = True


class ActorSettings(_Section, frozen=True):
    """One child actor of the host. Built-in actors need no table; others name a target."""

    #: ``module:Class`` of the actor; built-ins default to their own.
    target: str | None = None
    enabled: bool = True
    #: Default: the built-in actor's own (:data:`BUILTIN`), else ``permanent``.
    restart: RestartType | None = None
    #: Default: the built-in actor's own, else ``supervisor.shutdown_timeout_s``.
    shutdown_timeout_s: Positive | None = None
    #: Actor-specific settings, passed to the actor as-is.
    options: dict[str, Any] = {}


class RunnerSettings(_Section, frozen=True):
    """One ``[[runners]]`` table: a runner id this host serves for one server.

    The id is ``id`` if given, else derived from ``token`` (PROTOCOL_FACTS.md §i.1), else a
    stable id the gateway keeps in the state dir.
    """

    #: The server's base URL (``http(s)://`` or ``ws(s)://``; a path prefix is kept).
    server: str
    id: str | None = None
    #: The binding token, sent as ``X-Omnigent-Runner-Tunnel-Token``.
    token: str | None = None


class PolicyRule(_Section, frozen=True):
    """One ``[[server.policies]]`` rule of the embedded control plane.

    The first rule whose ``tool`` pattern (``fnmatch``: ``sys_os_*``) and ``phase`` match a
    ``/policies/evaluate`` request decides; with no match the answer is ALLOW.
    """

    tool: str
    action: Literal["allow", "deny", "ask"]
    phase: str = "PHASE_TOOL_CALL"
    #: Shown in the approval prompt (ask) or the denial (deny).
    message: str | None = None


class ServerSettings(_Section, frozen=True):
    """``[server]``: the embedded control plane ``corral up`` starts when no runner is set."""

    enabled: bool = True
    host: str = "127.0.0.1"
    #: 0 picks a free port on first start and keeps it (in the state dir) for restarts.
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    #: Directories of agent YAML files, besides the agents the package ships (``demo``).
    agents_dirs: list[str] = []
    policies: list[PolicyRule] = []
    #: Largest request body a client may send.
    max_body_bytes: PositiveInt = 1024 * 1024


class MetricsSettings(_Section, frozen=True):
    """``[metrics]``: the Prometheus endpoint (docs/deploy.md, *Metrics*)."""

    #: ``host:port`` to serve ``GET /metrics`` on (``127.0.0.1:9464``; ``[::1]:9464``; port 0
    #: picks a free one, which ``corral status --json`` shows); unset: no endpoint.
    listen: str | None = None


#: The log levels, least severe first (``[logging] level``, ``CORRAL_LOG_LEVEL``).
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
#: How a log record is written: ``key=value`` pairs, or one JSON object per line.
LogFormat = Literal["logfmt", "json"]


class LoggingSettings(_Section, frozen=True):
    """``[logging]``: what every process of the host logs, how, and where besides stderr."""

    #: ``CORRAL_LOG_LEVEL`` overrides it.
    level: LogLevel = "info"
    #: ``corral up --log-format`` (``CORRAL_LOG_FORMAT``) overrides it.
    format: LogFormat = "logfmt"
    #: Also append every record to this file, rotated by size (relative to the config
    #: file's directory). None: stderr only.
    file: str | None = None
    #: The file is rotated once a record would take it past this size.
    max_bytes: PositiveInt = 10 * 1024 * 1024
    #: Rotated files kept (``corral.log.1`` is the newest); 0 keeps none.
    backups: Annotated[int, msgspec.Meta(ge=0, le=100)] = 5


class Config(_Section, frozen=True):
    """The whole of ``corral.toml``."""

    state_dir: str | None = None
    #: The runner workspace tools run in (``corral up --workspace``, ``CORRAL_WORKSPACE``).
    workspace: str | None = None
    bus: BusSettings = BusSettings()
    liveness: LivenessSettings = LivenessSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    actors: dict[str, ActorSettings] = {}
    runners: list[RunnerSettings] = []
    server: ServerSettings = ServerSettings()
    metrics: MetricsSettings = MetricsSettings()
    logging: LoggingSettings = LoggingSettings()


class ActorRole(_Section, frozen=True):
    """What the host knows of a built-in actor besides its code: how it is supervised and
    what the host hands it. Every difference between actors is a field here, so the host
    treats them all alike, by their role, never by name (docs/supervision.md)."""

    #: ``module:Class`` of the actor.
    target: str
    #: ``module:Struct`` of its ``[actors.<name>.options]``, decoded by the host at
    #: ``corral up`` so that a typo exits 2 naming the key instead of crash-looping the actor.
    #: Named, not imported: the floor imports nothing from above.
    options: str
    #: Its restart type unless ``[actors.<name>] restart`` says otherwise.
    restart: RestartType = "permanent"
    #: Its SIGTERM → SIGKILL time unless ``[actors.<name>] shutdown_timeout_s`` says
    #: otherwise (None: ``supervisor.shutdown_timeout_s``).
    shutdown_timeout_s: Positive | None = None
    #: It talks to the runners' servers: the host's runners join its ``runners`` option,
    #: and it restarts when a restarted control plane comes back with a new binding.
    serves_runners: bool = False
    #: It opens the runner's tunnel: with no runner configured, the host starts the embedded
    #: control plane for it (unless it is disabled or names runners of its own).
    opens_tunnel: bool = False
    #: ``workspace`` (``corral up --workspace``) reaches it as its ``workspace`` option.
    gets_workspace: bool = False
    #: It expands ``$VAR`` in agent specs: the host's variables that ``$VAR`` may name
    #: (:func:`corral._child_env.spec_variables`) reach it, hidden. No other actor sees them.
    expands_vars: bool = False
    #: Options it gets (unless set) saying whether another actor runs: option → actor.
    knows_actors: dict[str, str] = {}
    #: Lists of its inspection snapshot that ``corral status`` shows, under their own key.
    status_lists: list[str] = []


#: The actors the host runs by default, in start order (all start at once; the control
#: plane, when there is one, starts before them and so stops after them).
BUILTIN: dict[str, ActorRole] = {
    "journal": ActorRole(
        target="corral.actors.journal:JournalActor",
        options="corral.actors.journal:JournalOptions",
    ),
    "harness": ActorRole(
        target="corral.actors.harness:HarnessActor",
        options="corral.actors.harness:HarnessOptions",
        expands_vars=True,
        gets_workspace=True,
        status_lists=["workers"],
    ),
    "tools": ActorRole(
        target="corral.actors.tools:ToolsActor",
        options="corral.actors.tools:ToolsOptions",
        serves_runners=True,
        gets_workspace=True,
    ),
    "policy": ActorRole(
        target="corral.actors.policy:PolicyActor",
        options="corral.actors.policy:PolicyOptions",
        serves_runners=True,
    ),
    "dispatch": ActorRole(
        target="corral.actors.dispatch:DispatchActor",
        options="corral.actors.dispatch:DispatchOptions",
        serves_runners=True,
        knows_actors={"harness_actor": "harness"},
    ),
    "gateway": ActorRole(
        target="corral.actors.gateway:GatewayActor",
        options="corral.actors.gateway:GatewayOptions",
        serves_runners=True,
        opens_tunnel=True,
        status_lists=["tunnels"],
    ),
}

#: Built-in actor → its ``module:Class``, in start order.
BUILTIN_ACTORS: dict[str, str] = {name: role.target for name, role in BUILTIN.items()}

#: Built-in actor → its options Struct (``ActorRole.options``).
BUILTIN_OPTIONS: dict[str, str] = {name: role.options for name, role in BUILTIN.items()}

#: The role of an actor of your own (``[actors.<name>] target = ...``): none of the above.
CUSTOM_ROLE = ActorRole(target="", options="")


def role_of(name: str) -> ActorRole:
    """A built-in actor's role (even with another ``target``); an actor of your own has none."""
    return BUILTIN.get(name, CUSTOM_ROLE)


_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def parse_config(data: dict[str, Any]) -> Config:
    """Validate a parsed TOML document.

    Raises:
        ConfigError: naming the first bad key.
    """
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {exc}", key=_key_of(str(exc))) from None
    for name, actor in config.actors.items():
        if not _NAME.match(name):
            raise ConfigError(f"invalid config: actor name {name!r}", key=f"actors.{name}")
        if actor.target is None and name not in BUILTIN_ACTORS:
            raise ConfigError(
                f"invalid config: actor {name!r} is not built in and names no target",
                key=f"actors.{name}.target",
            )
        if actor.target is not None and not re.match(r"^[\w.]+:\w+$", actor.target):
            raise ConfigError(
                f"invalid config: target {actor.target!r} is not 'module:Class'",
                key=f"actors.{name}.target",
            )
    check_runners(config.runners)
    if config.metrics.listen is not None:
        listen_address(config.metrics.listen)
    return config


def listen_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port).

    Raises:
        ConfigError: naming ``metrics.listen``.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not (sep and host and port.isdigit() and int(port) < 65536):
        raise ConfigError(
            f"invalid config: metrics listen {text!r} is not 'host:port' (port 0-65535)",
            key="metrics.listen",
        )
    return host, int(port)


def check_runners(runners: list[RunnerSettings]) -> None:
    """Validate ``[[runners]]``: server URLs, ids, and no runner id twice.

    Raises:
        ConfigError: naming the key (``runners[1].server``).
    """
    seen: dict[str, int] = {}
    for i, runner in enumerate(runners):
        url = urlsplit(runner.server)
        if url.scheme not in ("http", "https", "ws", "wss") or not url.hostname:
            raise ConfigError(
                f"invalid config: runner server {runner.server!r} is not an "
                "http(s):// or ws(s):// URL",
                key=f"runners[{i}].server",
            )
        for field in ("id", "token"):
            value = getattr(runner, field)
            if value is not None and (not value or value != value.strip()):
                raise ConfigError(
                    f"invalid config: runner {field} must be non-empty, without spaces around",
                    key=f"runners[{i}].{field}",
                )
        identity = runner.id or (f"token:{runner.token}" if runner.token else None)
        if identity is None:
            continue
        if identity in seen:
            raise ConfigError(
                f"invalid config: runners[{seen[identity]}] and runners[{i}] are the same runner",
                key=f"runners[{i}].{'id' if runner.id else 'token'}",
            )
        seen[identity] = i


def check_options(name: str, options: dict[str, Any], schema: type[S]) -> S:
    """Decode actor ``name``'s ``[actors.<name>.options]`` with its options Struct.

    Raises:
        ConfigError: naming the key (``actors.dispatch.options.turn_timout_s``), in the words
            of every other config error.
    """
    try:
        return msgspec.convert(options, schema)
    except msgspec.ValidationError as exc:
        # msgspec names the path from the options table (``$``, ``$.runners[0]``).
        where = f"$.actors.{name}.options"
        text = str(exc)
        text = (
            text.replace("at `$", f"at `{where}")
            if " - at `$" in text
            else f"{text} - at `{where}`"
        )
        raise ConfigError(f"invalid config: {text}", key=_key_of(text)) from None


def _key_of(text: str) -> str | None:
    """The dotted key a msgspec validation message points at (``bus.hwm``)."""
    match = re.search(r"at `\$\.?([^`]*)`", text)
    key = match.group(1).replace("[...]", ".*") if match else ""
    unknown = re.search(r"(?:unknown|missing required) field `([^`]*)`", text)
    if unknown:
        key = f"{key}.{unknown.group(1)}" if key else unknown.group(1)
    return key or None


def load_config(path: Path | None) -> Config:
    """Read ``corral.toml`` (or return the defaults when ``path`` is None).

    The paths it names (``[server] agents_dirs``, ``[logging] file``) are made absolute
    against the config file's own directory, so the same file means the same thing from
    wherever ``corral up`` runs; ``~`` is expanded, absolute paths stay as they are.
    """
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    return relative_to(parse_config(data), path.absolute().parent)


def relative_to(config: Config, base: Path) -> Config:
    """``config`` with its relative paths resolved against ``base`` (the config's directory)."""

    def under(raw: str) -> str:
        return str(base / Path(raw).expanduser())

    server = msgspec.structs.replace(
        config.server, agents_dirs=[under(d) for d in config.server.agents_dirs]
    )
    logs = config.logging
    if logs.file:
        logs = msgspec.structs.replace(logs, file=under(logs.file))
    return msgspec.structs.replace(config, server=server, logging=logs)


def resolve_state_dir(flag: str | None, config: Config | None = None) -> Path:
    """The state dir: the flag, else ``CORRAL_STATE_DIR``, else the config, else a default."""
    raw = flag or os.environ.get("CORRAL_STATE_DIR") or (config.state_dir if config else None)
    if raw:
        return Path(raw).expanduser().absolute()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "corral"


def actor_plan(config: Config) -> list[tuple[str, str, ActorSettings]]:
    """The host's children in start order: built-ins first, then configured extras."""
    plan: list[tuple[str, str, ActorSettings]] = []
    for name, target in BUILTIN_ACTORS.items():
        settings = config.actors.get(name, ActorSettings())
        if settings.enabled:
            plan.append((name, settings.target or target, settings))
    for name, settings in config.actors.items():
        if name not in BUILTIN_ACTORS and settings.enabled:
            assert settings.target is not None
            plan.append((name, settings.target, settings))
    return plan
