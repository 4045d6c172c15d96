"""Each actor's protocol module against the actor: the union it declares is what it handles
and all its process decodes, and its header table names that union and the replies."""

from __future__ import annotations

import re
from types import ModuleType

import msgspec
import pytest

from corral import ProtocolError
from corral.actors._actor import Actor
from corral.actors.dispatch import DispatchActor
from corral.actors.dispatch import messages as dispatch
from corral.actors.gateway import GatewayActor
from corral.actors.gateway import messages as gateway
from corral.actors.harness import HarnessActor
from corral.actors.harness import messages as harness
from corral.actors.journal import JournalActor
from corral.actors.journal import messages as journal
from corral.actors.policy import PolicyActor
from corral.actors.policy import messages as policy
from corral.actors.tools import ToolsActor
from corral.actors.tools import messages as tools
from corral.bus import (
    ActorControl,
    BodyDecoder,
    BrokerInbound,
    Envelope,
    Message,
    Request,
    members,
    reply_type,
    tag_of,
)
from corral.harnesses.protocol import AnyOutput, WorkerInbound

ACTORS: list[tuple[type[Actor], ModuleType]] = [
    (DispatchActor, dispatch),
    (GatewayActor, gateway),
    (HarnessActor, harness),
    (JournalActor, journal),
    (PolicyActor, policy),
    (ToolsActor, tools),
]
IDS = [module.__name__.split(".")[-2] for _, module in ACTORS]

#: Every tag corral's actors, workers and broker know, to try on each decoder.
EVERY_TAG = {
    tag_of(cls)
    for cls in members(
        *(module.Inbound for _, module in ACTORS), AnyOutput, BrokerInbound, ActorControl
    )
}


def _envelope(tag: str) -> Envelope:
    body = msgspec.Raw(msgspec.msgpack.encode({"type": tag}))
    return Envelope(id="m1", sender="a", recipient="b", type=tag, body=body)


@pytest.mark.parametrize(("actor", "module"), ACTORS, ids=IDS)
def test_an_actor_handles_exactly_its_inbound_union(actor: type[Actor], module: ModuleType) -> None:
    assert set(actor._handlers) == set(members(module.Inbound))


@pytest.mark.parametrize(("actor", "module"), ACTORS, ids=IDS)
def test_an_actor_decodes_its_declared_tags_and_rejects_every_other(
    actor: type[Actor], module: ModuleType
) -> None:
    decoder = BodyDecoder(actor.inbound())
    declared = {tag_of(cls) for cls in members(module.Inbound, ActorControl)}
    assert set(decoder.tags) == declared
    for tag in sorted(EVERY_TAG | {"no.such.type"}):
        if tag in declared:
            try:
                decoder.decode(_envelope(tag))
            except ProtocolError as exc:  # a tag it knows, with required fields missing
                assert "missing required field" in str(exc), (tag, exc)
        else:
            with pytest.raises(ProtocolError, match=rf"^unknown message type '{re.escape(tag)}'$"):
                decoder.decode(_envelope(tag))


def _table(module: ModuleType) -> dict[str, str]:
    """The rows of a protocol module's ``Message → reply:`` table: message → reply."""
    doc = module.__doc__ or ""
    section = doc.split("Message → reply:\n", 1)[1].split("\n\n", 1)[0]
    return dict(re.findall(r"^    (\w+)\s+→ (\w+)", section, flags=re.M))


@pytest.mark.parametrize(("actor", "module"), ACTORS, ids=IDS)
def test_the_header_table_names_the_union_and_each_reply(
    actor: type[Actor], module: ModuleType
) -> None:
    rows = _table(module)
    named = members(*(getattr(module, name) for name in rows))
    assert set(named) == set(members(module.Inbound))
    for name, reply in rows.items():
        for cls in members(getattr(module, name)):
            if reply == "none":
                assert not issubclass(cls, Request), f"{cls.__name__} declares a reply"
            else:
                assert issubclass(cls, Request), f"{cls.__name__} declares no reply"
                assert reply_type(cls).__name__ == reply


def test_a_worker_decodes_only_its_inputs() -> None:
    decoder = BodyDecoder(WorkerInbound)
    assert set(decoder.tags) == {
        "harness.turn",
        "harness.tool_result",
        "harness.approval",
        "harness.policy_verdict",
        "harness.interrupt",
        "harness.inventory",
        "harness.resend",
        "harness.confirmed",
    }
    with pytest.raises(ProtocolError, match=r"^unknown message type 'journal\.append'$"):
        decoder.decode(_envelope("journal.append"))


def test_a_union_with_two_classes_of_one_tag_is_refused() -> None:
    class Twin(Message, tag="journal.append"):
        pass

    with pytest.raises(TypeError, match=r"^message tag 'journal\.append' used by "):
        members(journal.Inbound, Twin)
    with pytest.raises(TypeError, match=r"is not a message class$"):
        members(int)


def test_a_request_without_its_reply_type_is_an_error() -> None:
    class Bare(Request, tag="test.bare"):  # type: ignore[type-arg]
        pass

    with pytest.raises(TypeError, match=r"does not name its reply type"):
        reply_type(Bare)
