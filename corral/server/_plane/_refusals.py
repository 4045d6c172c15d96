"""The refusals of the plane: what the HTTP layer answers with an error status."""

from __future__ import annotations


class Refused(Exception):
    """A request the plane refuses: answered with ``status`` and ``{"error": slug, ...}``."""

    def __init__(self, status: int, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail


class Offline(Refused):
    """The runner is not connected and the request cannot wait for it."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, "runner_offline", detail)
