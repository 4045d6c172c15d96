"""The ``codex`` worker kind: the Codex CLI's app-server, one per worker, driven turn by turn.

``codex app-server`` is started on the session's first turn and kept for the next ones (its
start costs most of a second, a thread's open ~30 ms); a task of the worker's
(``TurnContext.services``) owns it and reads it, and a turn that finds it gone (it exited,
it was killed) starts another.
Its thread — Codex's conversation, kept in the session's ``CODEX_HOME`` — is opened once per
CLI: resumed by the id saved beside it (``thread/resume``), so a restarted worker goes on
with the same conversation; started (``thread/start``) in a home that has none, and then
given the history the turn's message carries (``thread/inject_items``), so a session whose
home was lost still goes on where it was.

A turn is ``turn/start`` with the user's new message, relayed by :class:`~._relay.Relay`
until ``turn/completed``. An interrupt (the worker cancels the turn) sends
``turn/interrupt`` and waits for the turn's end, then ends what Codex still runs of it (it
leaves an interrupted command running, in a session of its own); a CLI that does not end
its turn within :data:`INTERRUPT_GRACE_S` is ended itself. A CLI that dies mid-turn fails the
turn ``harness_crashed`` at once; the next turn starts another and resumes the thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import msgspec
import trio

from ... import clis
from .._cli_process import (
    CliError,
    interrupted_on_exit,
    open_cli,
    started_while_checked,
    unwrapped,
)
from .._llm_request import llm_request
from .._turn import TurnContext, TurnFailed
from ._home import Launch, cli_env, prepare, save_thread, saved_thread
from ._input import TurnInput, turn_input
from ._relay import APPROVALS, Relay, Usage
from ._rpc import (
    METHOD_NOT_FOUND,
    ApprovalAnswer,
    AppServer,
    Capabilities,
    ClientInfo,
    InitializeParams,
    Notification,
    ProtocolError,
    RpcFailed,
    ServerRequest,
    ThreadInjectItemsParams,
    ThreadOpened,
    ThreadResumeParams,
    ThreadStartParams,
    TurnInfo,
    TurnInterruptParams,
    TurnStarted,
    TurnStartParams,
    params_as,
    result_as,
)
from ._settings import Settings, provider_of, resolve_settings

log = logging.getLogger("corral.harnesses.codex")

#: Codex asks before anything but a known-safe read; commands may write the working dir.
APPROVAL_POLICY = "untrusted"
SANDBOX = "workspace-write"
#: How long an interrupted turn has to end before its CLI is ended instead.
INTERRUPT_GRACE_S = 5.0
#: ``experimentalApi``: the runner's tools go to Codex as ``dynamicTools``.
INITIALIZE = InitializeParams(
    client_info=ClientInfo(name="corral", version="1"),
    capabilities=Capabilities(experimental_api=True),
)


@dataclass
class _Wanted:
    """A turn's request for a running app-server, answered by :meth:`CodexHarness._run`."""

    launch: Launch
    done: trio.Event = field(default_factory=trio.Event)
    server: AppServer | None = None
    error: CliError | None = None


@dataclass
class _Running:
    """The app-server :meth:`CodexHarness._run` holds, and what this worker knows of it."""

    launch: Launch
    server: AppServer
    scope: trio.CancelScope
    #: Set once the CLI and its process group are ended.
    gone: trio.Event
    #: The thread it has open, the model it was opened for and the one Codex said it serves.
    thread: str | None = None
    opened_for: str = ""
    served: str = ""
    usage: Usage = field(default_factory=Usage)


class CodexHarness:
    """The ``codex`` worker kind.

    Args:
        options: worker options from the harness actor (the kinds' constructor takes them;
            this one reads none: its settings are the agent spec's).
        environ: where the ``HARNESS_*`` variables are read; ``os.environ`` by default.
    """

    def __init__(
        self,
        options: Mapping[str, object] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        self._wants, self._wanted = trio.open_memory_channel[_Wanted](0)
        self._running: _Running | None = None
        self._serving = False

    # --- the app-server, owned by a task of the worker's --------------------------------------

    async def _run(self) -> None:
        """Start an app-server whenever a turn needs one, and read it until it ends (a task
        in ``TurnContext.services``, as long-lived as the worker)."""
        async for wanted in self._wanted:
            try:
                await self._serve(wanted)
            except CliError as exc:
                wanted.error = exc
            finally:
                wanted.done.set()

    async def _serve(self, wanted: _Wanted) -> None:
        launch = wanted.launch
        try:
            await trio.to_thread.run_sync(prepare, launch)
        except OSError as exc:
            raise CliError(f"cannot prepare the codex home {launch.home}: {exc}") from exc
        argv = [launch.cli_path, "app-server"]
        env = cli_env(launch, self.environ)
        scope, gone = trio.CancelScope(), trio.Event()
        try:
            # Cancelled (:meth:`_end`), the block ends the CLI and its group before ``gone``.
            with scope, unwrapped():
                async with (
                    open_cli(argv, env=env, cwd=launch.workdir) as cli,
                    trio.open_nursery() as nursery,
                ):
                    server = AppServer(cli)
                    nursery.start_soon(_read, server)
                    try:
                        await server.request("initialize", INITIALIZE)
                        await server.notify("initialized")
                    except RpcFailed as exc:
                        raise CliError(str(exc)) from exc
                    self._running = _Running(launch, server, scope, gone)
                    wanted.server = server
                    wanted.done.set()
        finally:
            if self._running is not None and self._running.gone is gone:
                self._running = None
            gone.set()

    async def _app_server(self, turn: TurnContext, launch: Launch) -> _Running:
        """The running, initialized app-server for ``launch`` (one started for another is
        ended first).

        Raises:
            TurnFailed: ``harness_unavailable``: it cannot be started or initialized.
        """
        if not self._serving:
            turn.services.start_soon(self._run)
            self._serving = True
        running = self._running
        if running is not None and running.server.ended is not None:
            await running.gone.wait()  # it died: let its task let it go, then start another
            running = None
        elif running is not None and running.launch != launch:
            await self._end(running)
            running = None
        if running is not None:
            return running
        wanted = _Wanted(launch)
        await self._wants.send(wanted)
        await wanted.done.wait()
        running = self._running
        if wanted.server is None or running is None or running.server is not wanted.server:
            why = wanted.error or "it ended as it started"
            raise TurnFailed("harness_unavailable", f"the codex CLI could not start: {why}")
        return running

    async def _end(self, running: _Running) -> None:
        """End an app-server and wait until its task has let it go."""
        running.scope.cancel()
        await running.gone.wait()

    # --- a turn ------------------------------------------------------------------------------

    async def run_turn(self, turn: TurnContext) -> None:
        settings = resolve_settings(turn, self.environ)
        cli_path = clis.find("codex", self.environ)
        if cli_path is None:
            cli = clis.CLIS["codex"]
            raise TurnFailed(
                "harness_unavailable",
                f"harness 'codex' needs the 'codex' CLI on PATH, which was not found. "
                f"Install it with: {cli.install}",
            )
        given = turn_input(turn.message)
        if not given.parts:
            raise TurnFailed("bad_request", "the turn's message has no user input for codex")
        launch = Launch(
            cli_path=cli_path,
            home=turn.cli_home,
            workdir=turn.workdir,
            base_url=settings.base_url,
            api_key=settings.api_key,
        )
        question = llm_request(
            model=settings.model,
            messages=len(given.history) + 1,
            tools=len(given.tools),
            instructions=settings.instructions,
            last_user_message=given.text,
        )
        running = await started_while_checked(
            partial(turn.check_llm_request, question), partial(self._app_server, turn, launch)
        )
        try:
            await self._open_thread(running, settings, given)
            await self._turn(running, settings, given, turn)
        except (CliError, RpcFailed, ProtocolError) as exc:
            if running.server.ended is not None:
                raise TurnFailed("harness_crashed", f"the codex CLI ended: {exc}") from exc
            raise TurnFailed("harness_error", str(exc)) from exc

    async def _open_thread(self, running: _Running, settings: Settings, given: TurnInput) -> None:
        """Open the session's thread in this app-server, once: resume the saved one, else
        start one and give it the history."""
        if running.thread is not None:
            return
        launch, server = running.launch, running.server
        start = ThreadStartParams(
            model=settings.model,
            cwd=str(launch.workdir),
            approval_policy=APPROVAL_POLICY,
            sandbox=SANDBOX,
            developer_instructions=settings.instructions,
            dynamic_tools=given.tools or None,
        )
        saved = await trio.to_thread.run_sync(saved_thread, launch.codex_home)
        opened: ThreadOpened | None = None
        if saved is not None:
            try:
                # Its dynamic tools are the thread's: Codex keeps them with it.
                kept = {
                    k: v for k, v in msgspec.structs.asdict(start).items() if k != "dynamic_tools"
                }
                resume = ThreadResumeParams(**kept, thread_id=saved)
                result = await server.request("thread/resume", resume)
                opened = result_as(result, ThreadOpened, "thread/resume")
            except RpcFailed as exc:
                log.warning("thread %s could not be resumed, starting another: %s", saved, exc)
        if opened is None:
            result = await server.request("thread/start", start)
            opened = result_as(result, ThreadOpened, "thread/start")
            if given.history:
                seed = ThreadInjectItemsParams(thread_id=opened.thread.id, items=given.history)
                await server.request("thread/inject_items", seed)
            # Saved once it has the history: a turn cut off before starts (and seeds) anew.
            await trio.to_thread.run_sync(save_thread, launch.codex_home, opened.thread.id)
        running.thread, running.opened_for, running.served = (
            opened.thread.id,
            settings.model,
            opened.model,
        )

    async def _turn(
        self, running: _Running, settings: Settings, given: TurnInput, turn: TurnContext
    ) -> None:
        server, thread = running.server, running.thread
        assert thread is not None
        # What Codex said it serves, for the model the thread was opened with; a turn that
        # asks for another is served that one (Codex says no more).
        served = running.served if settings.model == running.opened_for else settings.model
        relay = Relay(
            turn,
            server,
            served=served,
            provider=provider_of(settings.base_url),
            usage=running.usage,
            idle_timeout_s=settings.idle_timeout_s,
            tools=frozenset(t["name"] for t in given.tools),
        )
        params = TurnStartParams(thread_id=thread, input=given.parts, model=settings.model)
        with server.listen() as events:
            try:
                async with interrupted_on_exit(
                    relay,
                    end=partial(self._end, running),
                    interrupt=partial(self._interrupt, running, relay, events),
                ):
                    ended = await self._relayed(relay, events, params)
            finally:
                # What the thread has used so far is what the next turn's usage starts from.
                running.usage = Usage(before=relay.usage.now or relay.usage.before)
        if ended.status == "failed":
            raise TurnFailed("provider_error", relay.failure(ended))
        if ended.status == "interrupted":
            raise TurnFailed("interrupted", "codex interrupted the turn")

    async def _relayed(
        self,
        relay: Relay,
        events: trio.MemoryReceiveChannel[Notification | ServerRequest],
        params: TurnStartParams,
    ) -> TurnInfo:
        """Start Codex's turn and relay it to its end."""
        server = relay.server

        async def start() -> None:
            try:
                answer = await server.request("turn/start", params)
            except RpcFailed:
                relay.outstanding = False  # refused: no turn runs to interrupt
                raise
            started = result_as(answer, TurnStarted, "turn/start")
            relay.codex_turn = relay.codex_turn or started.turn.id

        with unwrapped():
            async with trio.open_nursery() as nursery:
                relay.outstanding = True
                # Relayed from the start: Codex may say something before it answers.
                nursery.start_soon(start)
                ended = await relay.run(events, nursery)
                # Anything still asking was asked of a turn Codex has ended.
                nursery.cancel_scope.cancel()
        return ended

    async def _interrupt(
        self,
        running: _Running,
        relay: Relay,
        events: trio.MemoryReceiveChannel[Notification | ServerRequest],
    ) -> None:
        """Stop Codex's turn (the worker's turn was cancelled, or failed): ``turn/interrupt``,
        then its end, then whatever it left running; end the CLI if it does not comply."""
        server = running.server
        if server.ended is not None:
            return
        known = trio.Event()
        over = trio.Event()
        if relay.codex_turn is not None:
            known.set()

        async def drain() -> None:
            async for message in events:
                if isinstance(message, ServerRequest) and message.method in APPROVALS:
                    await server.answer(message, ApprovalAnswer(decision="decline"))
                elif isinstance(message, ServerRequest):
                    await server.refuse(message, METHOD_NOT_FOUND, "the turn is being stopped")
                elif message.method == "turn/started" and relay.codex_turn is None:
                    relay.codex_turn = params_as(message, TurnStarted).turn.id
                    known.set()
                elif message.method == "turn/completed":
                    over.set()
                    return

        with trio.move_on_after(INTERRUPT_GRACE_S):
            try:
                with unwrapped():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(drain)
                        await known.wait()
                        assert relay.codex_turn is not None
                        params = TurnInterruptParams(
                            thread_id=running.thread or "", turn_id=relay.codex_turn
                        )
                        await server.request("turn/interrupt", params)
                        await over.wait()
                        nursery.cancel_scope.cancel()
            except (CliError, RpcFailed, ProtocolError) as exc:
                log.warning("codex did not take the interrupt: %s", exc)
        if over.is_set():
            ended = await trio.to_thread.run_sync(server.cli.end_commands)
            if ended:
                log.info("ended %d process(es) the interrupted codex turn left running", ended)
        else:
            log.warning("codex did not end its turn in %gs: ending the CLI", INTERRUPT_GRACE_S)
            await self._end(running)


async def _read(server: AppServer) -> None:
    """Read the app-server until it ends (its end is logged: the turn it cut short, if any,
    reports it)."""
    try:
        await server.read()
    except CliError as exc:
        log.warning("the codex app-server ended: %s", exc)
