"""The tunnel's frames (PROTOCOL_FACTS.md §i.2, PROTOCOL_0_19.md §A): tagged Structs, JSON codec.

Every WebSocket text message on a runner tunnel is one JSON object tagged by ``kind``. The
server's frames are decoded strictly at the edge (:data:`decode_frame`); the runner's are
encoded with :data:`encode_frame`.
"""

from __future__ import annotations

import re
from typing import Literal, dataclass_transform

import msgspec

FRAME_PROTOCOL_VERSION = 1
#: Asks the server for ``event.ready`` (§A.3). corral never sends ``event.batch``: every
#: session event rides ``GET .../stream``, as with omnigent's own ``openai-agents`` runner.
EVENT_INGEST_CAPABILITY = "session-event-ingest-v1"
_TEXT_TYPES = ("text/", "application/json", "application/x-ndjson")


# As for bus messages (corral.bus.Message): a type checker reads each class statement alone, so
# it must be told that subclasses inherit ``frozen`` and ``kw_only``.
@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(msgspec.field,))
class Frame(msgspec.Struct, tag_field="kind", frozen=True, kw_only=True):
    """Base of tunnel frames: one JSON object per WebSocket text message, tagged by ``kind``."""


class HelloFrame(Frame, tag="hello", omit_defaults=True):
    """The runner's first frame (§A.2); empty ``capabilities`` and a None id are left out."""

    runner_version: str
    frame_protocol_version: int
    harnesses: list[str]
    envs: list[str]
    telemetry_opt_out: bool
    capabilities: list[str] = []
    #: 32 hex digits, new on every connection attempt; only for log correlation.
    connection_id: str | None = None


class RequestFrame(Frame, tag="request"):
    id: str
    method: str
    path: str
    query_string: str = ""
    headers: list[tuple[str, str]] = []
    body: str | None = None
    encoding: Literal["utf-8", "base64"] = "utf-8"
    stream: bool = True


class RequestCancelFrame(Frame, tag="request.cancel"):
    id: str
    reason: str = "client_disconnected"


class PingFrame(Frame, tag="ping"):
    ts: int


class PongFrame(Frame, tag="pong"):
    ts: int


class ResponseHeadFrame(Frame, tag="response.head"):
    id: str
    status: int
    headers: list[tuple[str, str]]


class ResponseBodyFrame(Frame, tag="response.body"):
    id: str
    body: str
    encoding: Literal["utf-8", "base64"]


class ResponseEndFrame(Frame, tag="response.end"):
    id: str


class EventReadyFrame(Frame, tag="event.ready"):
    """The server accepts ``event.batch`` on this tunnel generation (§A.3)."""


class EventAckFrame(Frame, tag="event.ack"):
    """The server's answer to an ``event.batch``: entries ``[0, applied)`` were applied."""

    id: str
    applied: int
    error: str | None = None
    retryable: bool = False


class WsOpenFrame(Frame, tag="ws.open"):
    ch_id: str
    path: str = ""
    query_string: str = ""


class WsDataFrame(Frame, tag="ws.frame"):
    ch_id: str
    data: str = ""
    encoding: str = "utf-8"


class WsCloseFrame(Frame, tag="ws.close"):
    ch_id: str
    code: int = 1000
    reason: str = ""


ServerFrame = (
    RequestFrame
    | RequestCancelFrame
    | PingFrame
    | EventReadyFrame
    | EventAckFrame
    | WsOpenFrame
    | WsDataFrame
    | WsCloseFrame
)
#: Decodes (and validates) one frame from the server.
decode_frame = msgspec.json.Decoder(ServerFrame).decode
#: Encodes one frame of the runner's.
encode_frame = msgspec.json.Encoder().encode
#: Finds the id of a ``request`` frame too large to decode, so that it can be answered 413.
OVERSIZED_REQUEST_ID = re.compile(
    r'"kind"\s*:\s*"request".*?"id"\s*:\s*"([^"\\]{1,128})"', re.DOTALL
)


def body_encoding(headers: list[tuple[str, str]]) -> Literal["utf-8", "base64"]:
    """``utf-8`` for text, JSON, JSON lines and SSE content types, else ``base64`` (§i.2)."""
    ctype = next((v for k, v in headers if k.lower() == "content-type"), "").strip().lower()
    return "utf-8" if ctype.startswith(_TEXT_TYPES) else "base64"
