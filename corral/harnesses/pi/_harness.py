"""The ``pi`` worker kind: pi's RPC mode, one CLI per worker, driven turn by turn.

``pi --mode rpc --no-session`` is started on the session's first turn and kept for the next
ones (its start costs ~0.35 s), in a task of the worker's (``TurnContext.services``); it
keeps the conversation in memory. A turn that finds it gone (it exited, it was killed), or
started for another model, provider, instructions or runner tools, starts another — which
has none of the conversation, so that turn gives it the history its message carries
(``_input.py``). A new worker (the old one killed) does the same.

A turn is one ``prompt`` with the user's new message, relayed by :class:`~._relay.Relay`
until pi settles. An interrupt (the worker cancels the turn) sends ``abort`` — pi stops its
model call or the command it runs — dismisses the questions pi's gate has out, and waits
until pi settles; a CLI that does not within :data:`INTERRUPT_GRACE_S` is ended itself. A
CLI that dies mid-turn fails the turn ``harness_crashed`` at once (``harness_unavailable``
if it never answered: it could not start); the next turn starts another.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

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
from ._home import Launch, argv, cli_env, prepare
from ._input import TurnInput, prompt_text, runner_tools, turn_input
from ._relay import Relay
from ._rpc import DIALOGS, CommandFailed, PiRpc, ProtocolError
from ._settings import Settings, provider_of, resolve_settings

log = logging.getLogger("corral.harnesses.pi")

CLI = "pi"
#: How long an interrupted run has to settle before its CLI is ended instead.
INTERRUPT_GRACE_S = 5.0


@dataclass
class _Running:
    """The CLI a task of the worker's holds, and what this worker knows of it."""

    launch: Launch
    rpc: PiRpc
    scope: trio.CancelScope
    #: Set once the CLI and its process group are ended.
    gone: trio.Event
    #: Prompts it took: none yet means it has none of the conversation.
    prompts: int = 0


class PiHarness:
    """The ``pi`` worker kind.

    Args:
        options: worker options from the harness actor (this kind reads none: its settings
            are the agent spec's).
        environ: where the ``HARNESS_*`` variables and ``CORRAL_CLI_PATH`` are read;
            ``os.environ`` by default.
    """

    def __init__(
        self,
        options: Mapping[str, object] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        self._running: _Running | None = None

    # --- the CLI, held by a task of the worker's ------------------------------------------

    async def _hold(
        self, launch: Launch, task_status: trio.TaskStatus[_Running] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the CLI until cancelled (its exit is seen by the turn reading it)."""
        gone = trio.Event()
        try:
            with trio.CancelScope() as scope, unwrapped():
                async with (
                    open_cli(
                        argv(launch), env=cli_env(launch, self.environ), cwd=launch.workdir
                    ) as cli,
                    trio.open_nursery() as nursery,
                ):
                    rpc = PiRpc(cli)
                    nursery.start_soon(_read, rpc)
                    task_status.started(_Running(launch, rpc, scope, gone))
                    await trio.sleep_forever()
        finally:
            gone.set()

    async def _cli(self, turn: TurnContext, launch: Launch) -> _Running:
        """The running CLI for ``launch`` (one that ended, or runs for another, is ended
        first).

        Raises:
            TurnFailed: ``harness_unavailable``: it cannot be started.
        """
        running = self._running
        if running is not None and (running.rpc.ended is not None or running.launch != launch):
            await self._end(running)
            running = None
        if running is None:
            try:
                await trio.to_thread.run_sync(prepare, launch)
                with unwrapped():
                    running = await turn.services.start(self._hold, launch)
            except (OSError, CliError) as exc:
                why = f"the pi CLI could not start: {exc}"
                raise TurnFailed("harness_unavailable", why) from exc
            self._running = running
        return running

    async def _end(self, running: _Running) -> None:
        """End a CLI and wait until its task has let it go."""
        running.scope.cancel()
        await running.gone.wait()
        if self._running is running:
            self._running = None

    # --- a turn ---------------------------------------------------------------------------

    async def run_turn(self, turn: TurnContext) -> None:
        settings = resolve_settings(turn, self.environ)
        cli_path = clis.find(CLI, self.environ)
        if cli_path is None:
            harness = turn.start.harness_override or turn.start.harness or "pi"
            raise TurnFailed(
                "harness_unavailable",
                f"harness {harness!r} needs the {CLI!r} CLI on PATH, which was not found. "
                f"Install it with: {clis.CLIS[CLI].install}",
            )
        given = turn_input(turn.message)
        if not given.text and not given.images:
            raise TurnFailed("bad_request", "the turn's message has no user input for pi")
        launch = Launch(
            cli_path=cli_path,
            home=turn.cli_home,
            workdir=turn.workdir,
            base_url=settings.base_url,
            api=settings.api,
            model=settings.model,
            instructions=settings.instructions,
            api_key=settings.api_key,
            tools=runner_tools(turn.message),
        )
        question = llm_request(
            model=settings.model,
            messages=len(given.history) + 1,
            tools=len(launch.tools),
            instructions=settings.instructions,
            last_user_message=given.text,
        )
        running = await started_while_checked(
            partial(turn.check_llm_request, question), partial(self._cli, turn, launch)
        )
        try:
            await self._turn(running, settings, given, turn)
        except (CliError, CommandFailed, ProtocolError) as exc:
            if running.rpc.ended is not None:
                code = "harness_crashed" if running.rpc.answered else "harness_unavailable"
                raise TurnFailed(code, f"the pi CLI ended: {exc}") from exc
            raise TurnFailed("harness_error", str(exc)) from exc

    async def _turn(
        self, running: _Running, settings: Settings, given: TurnInput, turn: TurnContext
    ) -> None:
        rpc = running.rpc
        relay = Relay(
            turn,
            rpc,
            served=settings.model,
            provider=provider_of(settings.base_url),
            idle_timeout_s=settings.idle_timeout_s,
            tools=frozenset(name for name, _, _ in running.launch.tools),
        )
        prompt: dict[str, Any] = {"message": prompt_text(given, seed=running.prompts == 0)}
        if given.images:
            prompt["images"] = given.images

        async def start() -> None:
            try:
                await rpc.command("prompt", **prompt)
            except CommandFailed:
                relay.outstanding = False  # refused: no run to abort
                raise
            running.prompts += 1
            relay.took()

        with rpc.listen() as events:
            async with interrupted_on_exit(
                relay,
                end=partial(self._end, running),
                interrupt=partial(self._interrupt, running, relay, events),
            ):
                with unwrapped():
                    async with trio.open_nursery() as nursery:
                        relay.outstanding = True
                        nursery.start_soon(start)
                        settled = await relay.run(events, nursery)
                        nursery.cancel_scope.cancel()
        if relay.failure is not None:
            raise TurnFailed("provider_error", f"pi: {relay.failure}")
        if settled.aborted:
            raise TurnFailed("interrupted", "pi aborted the turn")

    async def _interrupt(
        self,
        running: _Running,
        relay: Relay,
        events: trio.MemoryReceiveChannel[dict[str, Any]],
    ) -> None:
        """Stop pi's run (the worker's turn was cancelled, or failed): ``abort``, dismiss
        the gate's questions, then wait until it settles (and answers the abort); end the
        CLI if it does not."""
        rpc = running.rpc
        if rpc.ended is not None:
            return
        over = trio.Event()

        async def drain() -> None:
            async for event in events:
                if event.get("type") == "extension_ui_request" and event.get("method") in DIALOGS:
                    await rpc.cli.send(
                        {"type": "extension_ui_response", "id": event.get("id"), "cancelled": True}
                    )
                elif event.get("type") == "agent_settled":
                    over.set()
                    return

        with trio.move_on_after(INTERRUPT_GRACE_S):
            try:
                with unwrapped():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(drain)
                        # The abort first: a question dismissed before it would let pi go
                        # on to its next model call. pi answers it only once settled, and
                        # settles nothing while a dialog is open: those are dismissed next.
                        abort = functools.partial(rpc.command, "abort", timeout=INTERRUPT_GRACE_S)
                        await nursery.start(abort)
                        for request in list(relay.questions.values()):
                            await rpc.answer(request, cancelled=True)
                        relay.questions.clear()
                        await over.wait()
            except (CliError, CommandFailed) as exc:
                log.warning("pi did not take the abort: %s", exc)
        if not over.is_set():
            log.warning("pi did not settle in %gs: ending the CLI", INTERRUPT_GRACE_S)
            await self._end(running)


async def _read(rpc: PiRpc) -> None:
    """Read the CLI until it ends (its end is logged: the turn it cut short reports it)."""
    try:
        await rpc.read()
    except CliError as exc:
        log.warning("the pi CLI ended: %s", exc)
