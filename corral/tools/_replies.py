"""The fixed shapes the OS tools and the environment routes answer with.

They are TypedDicts, not Structs: each answer is built as a dict and JSON-encoded as it is
(``json.dumps``), so the keys, their order and the bytes on the wire are the ones the code
writes; the types only say which keys there are. Shapes of the routes follow omnigent's
runner (PROTOCOL_FACTS §ii.5).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from .terminals._resources import TerminalResource

# -- the OS tools (sys_os_read / write / edit / shell) ---------------------------------------


class ReadResult(TypedDict):
    """What ``sys_os_read`` answers; ``next_offset`` only when the window stopped early."""

    path: str
    content: str
    encoding: Literal["utf-8"]
    offset: int
    limit: int
    returned_lines: int
    #: None past the counting bound.
    total_lines: int | None
    truncated: bool
    next_offset: NotRequired[int]


class WriteResult(TypedDict):
    """What ``sys_os_write`` answers."""

    path: str
    created: bool
    bytes_written: int


class EditResult(TypedDict):
    """What ``sys_os_edit`` answers."""

    path: str
    replacements: int


class ShellResult(TypedDict):
    """A finished shell command (``sys_os_shell`` answers it as it is)."""

    stdout: str
    stderr: str
    #: Negative when a signal ended the shell.
    exit_code: int | None
    timed_out: bool
    shell: str
    cwd: str


# -- the environment routes -------------------------------------------------------------------


class PageParams(TypedDict):
    """The paging parameters of a list route, checked."""

    limit: int
    order: str
    after: str | None
    before: str | None


class ReachRoot(TypedDict):
    """A directory a browser can reach, and how."""

    path: str
    access: Literal["write"]
    origin: Literal["cwd"]


class Reach(TypedDict):
    """What a browser can reach in an environment."""

    unconfined: bool
    roots: list[ReachRoot]


class EnvironmentMetadata(TypedDict):
    """``metadata`` of the environment resource; the rest only when it is described alone."""

    environment_type: Literal["caller_process"]
    role: Literal["primary"]
    root: NotRequired[str]
    home: NotRequired[str]
    reachable: NotRequired[Reach]


class EnvironmentResource(TypedDict):
    """The ``session.resource`` of a session's ``default`` environment."""

    id: str
    object: Literal["session.resource"]
    type: Literal["environment"]
    session_id: str
    name: str
    metadata: EnvironmentMetadata


#: A ``session.resource`` a runner lists: its environment or one of its terminals.
Resource: TypeAlias = EnvironmentResource | TerminalResource


class Page(TypedDict):
    """A list page of resources."""

    object: Literal["list"]
    data: list[Resource]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Entry(TypedDict):
    """A filesystem entry of an environment."""

    id: str
    object: str
    name: str
    path: str
    type: str
    #: A regular file's size, else None.
    bytes: int | None
    modified_at: int | None


class DirectoryPage(TypedDict):
    """A page of a directory's entries."""

    object: Literal["list"]
    base: str
    data: list[Entry]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileContent(TypedDict):
    """A file's content, as text or base64."""

    object: Literal["session.environment.filesystem.file_content"]
    path: str
    content_type: str | None
    bytes: int
    truncated: bool
    encoding: Literal["utf-8", "base64"]
    content: str


class FileWritten(TypedDict):
    """The ``PUT .../filesystem/{path}`` answer."""

    object: Literal["session.environment.filesystem.write_result"]
    operation: Literal["write"]
    path: str
    created: bool
    bytes_written: int
    entry: Entry


class FileEdited(TypedDict):
    """The ``PATCH .../filesystem/{path}`` answer."""

    object: Literal["session.environment.filesystem.edit_result"]
    operation: Literal["edit"]
    path: str
    replacements: int
    bytes_before: int
    bytes_after: int
    entry: Entry


class PathDeleted(TypedDict):
    """The ``DELETE .../filesystem/{path}`` answer."""

    object: Literal["session.environment.filesystem.delete_result"]
    operation: Literal["delete"]
    path: str
    deleted: Literal[True]
    type: str
    bytes_deleted: int
    entries_deleted: int


class SearchPage(TypedDict):
    """The entries a search found, sorted by path."""

    object: Literal["list"]
    base: str
    data: list[Entry]
    has_more: bool
    truncated: bool


class Change(TypedDict):
    """An uncommitted change of the environment's git work tree."""

    object: str
    path: str
    name: str
    status: str
    bytes: int | None
    modified_at: int | None
    lines_added: int | None
    lines_removed: int | None


class ChangesPage(TypedDict):
    """The ``GET .../changes`` answer, newest first."""

    object: Literal["list"]
    data: list[Change]
    has_more: bool


class FileDiff(TypedDict):
    """The ``GET .../diff/{path}`` answer."""

    object: Literal["session.environment.filesystem.file_diff"]
    path: str
    #: None: not at ``HEAD`` (new), or deleted now (``after``).
    before: str | None
    after: str | None


class ShellAnswer(TypedDict):
    """The ``POST .../shell`` answer."""

    object: Literal["session.environment.shell_result"]
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    cwd: str
