"""HTTP/1.1 read by hand on a trio stream, for the test fakes that answer it byte by byte
(``fake_openai``, ``fake_server``): a fake that writes its own bytes can also hang, drop or
pace an answer where a framework would not let it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import trio

__all__ = ["RawRequest", "read_request", "until_eof"]


@dataclass(frozen=True, slots=True)
class RawRequest:
    """One request as it came: its target with the query, its headers in order (names in
    lower case), its body (``content-length`` bytes)."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> RawRequest | None:
    """The next request on a keep-alive connection, or None once the client closed it.

    ``buffer`` holds what was read past the previous request; what is read past this one is
    left in it.
    """
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some()
        if not data:
            return None
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in header_lines:
        name, _, value = line.partition(":")
        headers.append((name.strip().lower(), value.strip()))
    length = int(dict(headers).get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        data = await stream.receive_some()
        if not data:
            return None
        body += data
    buffer[:] = body[length:]
    method, target, _ = request_line.split(" ", 2)
    return RawRequest(method, target, headers, bytes(body[:length]))


async def until_eof(stream: trio.SocketStream) -> None:
    """Read and drop everything until the client closes (a hung answer)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await stream.receive_some():
            pass
