"""What the zygote and its owner say to each other: one msgpack message per datagram.

Two ``SOCK_SEQPACKET`` socket pairs join them. On the *requests* pair the owner asks and
waits for the answer (:class:`Fork` → :class:`Born` or :class:`Refused`); on the *reports*
pair the zygote says, as it happens, that it is ready (:class:`Ready`) and how each child it
forked ended (:class:`Died`). An end of either pair (an empty read) means the other side is
gone.
"""

from __future__ import annotations

import msgspec


class _Message(msgspec.Struct, tag_field="kind", frozen=True, kw_only=True):
    pass


class Fork(_Message, tag="fork", frozen=True):
    """Fork a child that runs ``entry``'s ``main()`` (a module the zygote preloaded)."""

    entry: str
    #: Its environment as ``/proc/PID/environ`` shows it (the spawner's environ block).
    shown: dict[str, str]
    #: Variables only its ``os.environ`` gets (:data:`corral._child_env.HIDDEN_ENV`).
    hidden: dict[str, str] = {}
    cwd: str | None = None


class Born(_Message, tag="born", frozen=True):
    """The child was forked: its pid."""

    pid: int


class Refused(_Message, tag="refused", frozen=True):
    """The zygote did not fork: why (the owner then execs the child)."""

    reason: str


class Ready(_Message, tag="ready", frozen=True):
    """The zygote has imported what it preloads and takes requests."""

    pid: int


class Died(_Message, tag="died", frozen=True):
    """A child of the zygote exited: its pid and return code (``-N``: killed by signal N)."""

    pid: int
    code: int


class Sprout(_Message, tag="sprout", frozen=True):
    """To the seed (:mod:`._seed`): fork a zygote that imports ``items`` and serves the two
    sockets that came with this datagram (requests, then reports)."""

    items: list[str]
    #: Its environment, as an exec'd zygote's would be (never a secret: the allow-list and
    #: the log settings), so that it logs where its owner's processes do.
    env: dict[str, str] = {}


Request = Fork
Answer = Born | Refused
Report = Ready | Died

#: A datagram's largest size (a worker's environment is a few kB).
MAX_DATAGRAM = 1 << 20

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(Request).decode
decode_answer = msgspec.msgpack.Decoder(Answer).decode
decode_report = msgspec.msgpack.Decoder(Report).decode
decode_sprout = msgspec.msgpack.Decoder(Sprout).decode
