"""The rules bad input is checked against where it enters: JSON request bodies and session ids.

A floor module, because input enters in two programs that share nothing else: the runner (the
gateway's tunnel requests, dispatch's routes) and the embedded control plane's HTTP API. Each
answers a broken rule with a 4xx of its own shape; what the rules are, and the words that name
them, are the same on both sides and live here.

JSON bodies. :func:`load_json` refuses, before anything looks inside a body, what would
otherwise escape as an uncaught error later: bytes that are not UTF-8 (an ``UnicodeDecodeError``
inside ``json.loads``), a ``\\uD800``-style escape that is not half of a surrogate pair (Python's
``json`` accepts it and hands on a string that no UTF-8 encoder takes), and nesting deeper than
:data:`MAX_JSON_DEPTH` (a ``RecursionError`` in any recursive decoder or walker).

Session ids. The real server mints ids of 32 hex digits (``uuid4().hex``), and so does the control
plane; :data:`SESSION_ID_RULE` accepts those and the short names tests and tools use, and refuses
anything that could be a path (``..``, ``/``) or a control character, so a bad id is answered at
once instead of failing late somewhere it is used as a key.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ._exceptions import BadInput

#: How deep a request body's arrays and objects may nest. The deepest body the 0.19 server
#: sends (a message with tool schemas) nests about a dozen levels.
MAX_JSON_DEPTH = 128
#: The session id rule, as answered when it is broken.
SESSION_ID_RULE = "a session id is 1 to 128 characters, each a letter, a digit, '_' or '-'"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: An escaped high surrogate not followed by an escaped low one, or a low one not preceded by a
#: high one (a pair of escapes is one character outside the BMP, and fine).
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def load_json(body: bytes, what: str = "the request body") -> Any:
    """``body`` parsed as JSON, or :class:`BadInput` (400 ``invalid_json``) naming the reason.

    An empty body is refused like any other non-JSON body; callers that allow none check first.
    """
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{what} is not valid UTF-8 (at byte {exc.start})") from None
    try:
        value = msgspec.json.decode(body)
    except RecursionError:
        raise _too_deep(what) from None
    except msgspec.DecodeError as exc:
        if _LONE_SURROGATE.search(body):
            raise _bad(
                f"{what} holds a \\u escape of a lone UTF-16 surrogate (not half of a pair), "
                "which is not a Unicode character"
            ) from None
        raise _bad(f"{what} is not valid JSON: {exc}") from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise _too_deep(what)
    return value


def check_session_id(session_id: str) -> None:
    """Raise :class:`BadInput` (400 ``invalid_session_id``) unless ``session_id`` keeps the rule."""
    if not _SESSION_ID.fullmatch(session_id):
        shown = session_id if len(session_id) <= 64 else f"{session_id[:64]}..."
        message = f"Session id {shown!r} refused: {SESSION_ID_RULE}."
        raise BadInput(400, "invalid_session_id", message)


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _bad(message: str) -> BadInput:
    return BadInput(400, "invalid_json", message[:1].upper() + message[1:] + ".")


def _too_deep(what: str) -> BadInput:
    return _bad(f"{what} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep")
