"""The gateway: the server's runner tunnels ⇄ the bus (PROTOCOL_0_19.md; PROTOCOL_FACTS.md).

:class:`GatewayActor` (in ``_actor``) is the actor, with its route table; ``_tunnel`` holds a
runner's WebSocket connection and its reconnects, ``_wire`` the byte stream under it (a
frame is marked sent in the step that wrote it), ``_frames`` the tunnel's frames,
``_streams`` the durable buffer of session events, ``_vocabulary`` the event types the
server's stream accepts, ``_options`` the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

# Imported on first use (corral/_lazy.py): importing this package's ``messages``, as other
# actors do, must not load the whole actor.
if TYPE_CHECKING:
    from ._actor import GatewayActor as GatewayActor
    from ._actor import resources_fallback as resources_fallback
    from ._frames import EVENT_INGEST_CAPABILITY as EVENT_INGEST_CAPABILITY
    from ._frames import FRAME_PROTOCOL_VERSION as FRAME_PROTOCOL_VERSION
    from ._frames import EventAckFrame as EventAckFrame
    from ._frames import EventReadyFrame as EventReadyFrame
    from ._frames import Frame as Frame
    from ._frames import HelloFrame as HelloFrame
    from ._frames import PingFrame as PingFrame
    from ._frames import PongFrame as PongFrame
    from ._frames import RequestCancelFrame as RequestCancelFrame
    from ._frames import RequestFrame as RequestFrame
    from ._frames import ResponseBodyFrame as ResponseBodyFrame
    from ._frames import ResponseEndFrame as ResponseEndFrame
    from ._frames import ResponseHeadFrame as ResponseHeadFrame
    from ._frames import ServerFrame as ServerFrame
    from ._frames import WsCloseFrame as WsCloseFrame
    from ._frames import WsDataFrame as WsDataFrame
    from ._frames import WsOpenFrame as WsOpenFrame
    from ._frames import body_encoding as body_encoding
    from ._frames import decode_frame as decode_frame
    from ._frames import encode_frame as encode_frame
    from ._options import GatewayOptions as GatewayOptions
    from ._sse import DONE as DONE
    from ._sse import HEARTBEAT as HEARTBEAT
    from ._sse import SSE_HEADERS as SSE_HEADERS
    from ._sse import spaced_json as spaced_json
    from ._sse import sse_data as sse_data
    from ._sse import stream_type as stream_type
    from ._streams import StreamBuffer as StreamBuffer
    from ._tunnel import BODY_PIECE as BODY_PIECE
    from ._tunnel import CLOSE_MEANINGS as CLOSE_MEANINGS
    from ._tunnel import FATAL_CLOSE_CODES as FATAL_CLOSE_CODES
    from ._tunnel import ORIGIN as ORIGIN
    from ._tunnel import RECYCLE_CLOSE_CODES as RECYCLE_CLOSE_CODES
    from ._tunnel import RECYCLE_HTTP_STATUSES as RECYCLE_HTTP_STATUSES
    from ._tunnel import TOKEN_HEADER as TOKEN_HEADER
    from ._tunnel import Responder as Responder
    from ._tunnel import Tunnel as Tunnel
    from ._tunnel import TunnelDown as TunnelDown
    from ._tunnel import TunnelFatal as TunnelFatal
    from ._tunnel import backoff_delay as backoff_delay
    from ._tunnel import recycle_delay as recycle_delay
    from ._tunnel import runner_dispatch_failed as runner_dispatch_failed
    from ._tunnel import tunnel_url as tunnel_url
    from ._vocabulary import SERVER_STREAM_TYPES as SERVER_STREAM_TYPES

__getattr__, __dir__ = lazy_exports(__name__, __file__)
