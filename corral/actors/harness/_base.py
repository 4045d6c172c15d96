"""The state every part of the harness actor shares, and the helpers they all use.

:class:`~._actor.HarnessActor` is built as a chain of parts, each a class in a module of its
own, each adding one job to the one below it::

    HarnessBase    (_base)          the workers, turns and parked elicitations; sending
    WorkerPool     (_workers)       the session workers: spawned, called, heard, reaped
    Elicitations   (_elicitations)  parked elicitations: verdicts, cancellation, recovery
    TurnLife       (_turns)         the life of a turn: its start, its one terminal event
    HarnessActor   (_actor)         lifecycle, adoption, what a worker's exit does

A part calls only what is below it in the chain, so each reads (and type-checks) alone.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec

from ... import harnesses, logs
from ..._child_env import base_env
from ..._zygote import HTTP_CLIENT_MODULES, Zygote, seed_fd
from ...bus import Dedup, Message
from ...harnesses.protocol import ElicitationParked, Holdings, ResponseFailed, TurnStart
from ...instance import Instance
from ...tools.os_env import (
    default_os_env_root,
    effective_os_env,
    sanitize_conversation_id,
)
from .._actor import Actor, ActorContext
from .._children import ChildSupervisor
from .._deferred import Deferred
from .._process import spawn
from .._specs import Backoff, Liveness, SupFlags
from ._adopt import WORKER_MODULE, host_record
from ._options import HarnessOptions
from ._records import OwnedTurn, ParkedElicitation, WorkerState

log = logging.getLogger("corral.actors.harness")


class HarnessBase(Actor):
    """The harness actor's state: its options, its workers' supervisor and what it holds."""

    def __init__(self, ctx: ActorContext, peer: Any) -> None:
        super().__init__(ctx, peer)
        opts = msgspec.convert(ctx.options, HarnessOptions)
        self.idle_timeout_s = opts.idle_timeout_s
        self.start_timeout_s = opts.start_timeout_s
        live = peer.liveness
        self.liveness_s = opts.worker_liveness_s or live.interval_s * live.liveness
        self.crash_backoff_s = opts.crash_backoff_s
        self.extra_harnesses: dict[str, str] = dict(opts.harnesses)
        self.workspace = Path(opts.workspace).absolute() if opts.workspace else None
        # The tools actor's default when none is configured: the same directories, so a CLI
        # harness and the session's sys_os_* tools work in one place.
        self.os_env_root = (
            Path(opts.os_env_root)
            if opts.os_env_root
            else default_os_env_root(Instance(ctx.state_dir).actor_dir("tools"))
        )
        self.homes = ctx.data_dir / "homes"
        self.run_dir = ctx.data_dir / "workers"
        self.started_turns = Dedup(ctx.data_dir / "started-turns")
        #: Where workers are forked from (None: each is exec'd).
        self.zygote = (
            Zygote(
                worker_preload(),
                {**base_env(), **logs.child_env()},
                fallback=spawn,
                seed=seed_fd(),
            )
            if opts.zygote
            else None
        )
        # A worker is needed again only by its session's next turn: after a crash it is
        # restarted then (on demand), backed off and counted per session like any restart.
        self.children = ChildSupervisor(
            SupFlags(
                intensity=opts.worker_intensity,
                period_s=opts.worker_period_s,
                intensity_per="child",
                # Every wait is capped at 10 s, the first one too.
                backoff=Backoff(first_s=min(opts.crash_backoff_s, 10.0), max_s=10.0),
                liveness=Liveness(window_s=self.liveness_s, check_s=0.25),
            ),
            run_dir=self.run_dir,
            record=host_record(ctx),
            spawn=spawn if self.zygote is None else self.zygote.spawn,
        )
        self.workers: dict[str, WorkerState] = {}
        self.turns: dict[str, OwnedTurn] = {}
        #: A session's newest start, waiting for the stale turn this actor still holds to
        #: end (:meth:`_supersede`).
        self.waiting: dict[str, tuple[TurnStart, Deferred]] = {}
        self.parked: dict[str, ParkedElicitation] = {}
        #: What the workers adopted from a previous incarnation hold, by session, until
        #: their turns' redelivered starts are owned again (:func:`._adopt.take_back`).
        self.holdings: dict[str, Holdings] = {}
        #: Turns whose terminal is being sent (their start is acked once it is out).
        self.ending: set[str] = set()
        #: Turns a previous incarnation left behind and this one already ended.
        self.ended_turns: set[str] = set()
        #: Turns this incarnation took a start of (held now, or ended), newest last, bounded.
        self.taken: OrderedDict[str, None] = OrderedDict()
        self.stats = {"spawned": 0, "crashed": 0, "reaped": 0, "turns": 0}

    async def _emit(self, to: str, event: Message, session_id: str) -> None:
        try:
            await self.peer.cast(to, event, durable=True, session_id=session_id)
        except Exception:
            log.exception("could not deliver %s to %s", type(event).__name__, to)


def worker_preload() -> tuple[str, ...]:
    """What the zygote imports: the worker runtime, the built-in harness kinds and what an
    HTTP client imports on its first request (an ``openai`` worker makes them): a worker
    then imports nothing of its own kind either. The last includes the TLS context every
    client of a process shares (:mod:`corral._tls`)."""
    kinds = sorted(set(harnesses.HARNESSES.values()))
    return (WORKER_MODULE, *kinds, *HTTP_CLIENT_MODULES)


def places_of(base: HarnessBase, msg: TurnStart) -> TurnStart:
    """``msg`` as its worker gets it: with the session's tool working directory (where its
    ``sys_os_*`` tools run, T-05..T-11) and a directory of its own for a CLI's home, under
    this actor's durable directory (both created).

    Raises:
        OSError: one of them cannot be created.
    """
    env = effective_os_env(
        msg.spec,
        workspace=base.workspace,
        conversation_id=msg.session_id,
        os_env_root=base.os_env_root,
    )
    home = base.homes / sanitize_conversation_id(msg.session_id)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return msgspec.structs.replace(msg, workdir=str(env["cwd"]), cli_home=str(home))


def turn_failed(msg: TurnStart | ElicitationParked, code: str, message: str) -> ResponseFailed:
    """The ``response.failed`` that ends ``msg``'s turn with error ``code``."""
    return ResponseFailed(turn_id=msg.turn_id, error={"code": code, "message": message})
