"""The gateway: the server's runner tunnels ⇄ the bus (PROTOCOL_FACTS.md §i, §ii, §v.6).

:class:`GatewayActor` (in ``_actor``) is the actor, with its route table; ``_tunnel`` holds a
runner's WebSocket connection and its reconnects, ``_frames`` the tunnel's frames,
``_streams`` the durable buffer of session events, ``_options`` the settings.
"""

from ._actor import HEARTBEAT as HEARTBEAT
from ._actor import SSE_HEADERS as SSE_HEADERS
from ._actor import GatewayActor as GatewayActor
from ._actor import sse_data as sse_data
from ._frames import FRAME_PROTOCOL_VERSION as FRAME_PROTOCOL_VERSION
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
from ._options import GatewayOptions as GatewayOptions
from ._streams import StreamBuffer as StreamBuffer
from ._tunnel import BODY_PIECE as BODY_PIECE
from ._tunnel import FATAL_CLOSE_CODES as FATAL_CLOSE_CODES
from ._tunnel import ORIGIN as ORIGIN
from ._tunnel import TOKEN_HEADER as TOKEN_HEADER
from ._tunnel import Responder as Responder
from ._tunnel import Tunnel as Tunnel
from ._tunnel import TunnelDown as TunnelDown
from ._tunnel import TunnelFatal as TunnelFatal
from ._tunnel import backoff_delay as backoff_delay
from ._tunnel import tunnel_url as tunnel_url
