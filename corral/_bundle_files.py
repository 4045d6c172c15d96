"""What an agent bundle holds: a tar.gz from the network read safely, and one made.

Bundles are untrusted input (:mod:`corral.spec` parses the YAML they carry). Nothing is
extracted to disk, and still what an extracting reader would trip on is refused: absolute or
``..`` member paths, links, devices. Both the compressed and the unpacked size are bounded, so a
gzip bomb costs at most ``max_unpacked`` bytes of memory.

This module is a floor module: it imports nothing from ``corral.actors``, ``corral.server``
or ``corral.cli``.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zlib
from collections.abc import Iterator

from ._exceptions import SpecError

#: Largest compressed bundle :func:`read_bundle` accepts.
MAX_BUNDLE_BYTES = 8 * 1024 * 1024
#: Largest total size of a bundle's members once unpacked.
MAX_UNPACKED_BYTES = 32 * 1024 * 1024
#: Largest agent YAML document.
MAX_YAML_BYTES = 1024 * 1024
#: Most members a bundle may hold.
MAX_MEMBERS = 2048
#: A sub-agent's name: one path segment of ``agents/<name>/`` in a directory bundle.
SUB_AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def read_bundle(
    data: bytes,
    *,
    max_bytes: int = MAX_BUNDLE_BYTES,
    max_unpacked: int = MAX_UNPACKED_BYTES,
    sub_agent: str | None = None,
) -> tuple[str, bytes, bytes | None, dict[str, bytes]]:
    """The agent YAML of a bundle (``sub_agent``'s, when given): its path and bytes, the
    ``AGENTS.md`` beside a ``config.yaml`` if there is one, and the YAML of each directory
    child beside it (``agents/<name>/config.yaml``) by name (:func:`corral.spec.load_bundle`
    says which YAML is picked).

    Raises:
        SpecError: the bundle is too large (compressed or unpacked), not gzip, not a tar
            archive, has an absolute or ``..`` member path, a link or device member, or holds
            no YAML or several candidates.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SpecError(f"agent bundle must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise SpecError(f"agent bundle is too large: {len(data)} bytes (limit {max_bytes})")
    if data[:2] != b"\x1f\x8b":
        raise SpecError("agent bundle is not gzip data (expected a tar.gz)")
    raw = _gunzip(data, max_unpacked)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
            return _read_agent_yaml(archive, max_unpacked, sub_agent)
    except tarfile.TarError as exc:
        raise SpecError(f"agent bundle is not a tar archive: {exc}") from exc


def make_bundle(yaml_text: str, *, filename: str = "agent.yaml") -> bytes:
    """A bundle holding ``yaml_text`` as ``filename``, byte for byte reproducible.

    For tests and an embedded server; the real server builds its bundles itself.
    """
    return make_bundle_files({filename: yaml_text.encode()})


def make_bundle_files(files: dict[str, bytes]) -> bytes:
    """A bundle of several files (relative ``/`` paths → bytes), in path order, byte for
    byte reproducible: how a directory-format agent is bundled, as the real server does."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(files):
            payload = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(payload))
    return gzip.compress(buffer.getvalue(), mtime=0)


def _read_agent_yaml(
    archive: tarfile.TarFile, max_unpacked: int, sub_agent: str | None = None
) -> tuple[str, bytes, bytes | None, dict[str, bytes]]:
    """The agent YAML's path and bytes (``sub_agent``'s, when given), the ``AGENTS.md``
    beside a ``config.yaml`` if there is one, and the YAML of each directory child beside it
    (``agents/<name>/config.yaml``) by name, after checking every member."""
    files: dict[str, tarfile.TarInfo] = {}
    total = 0
    for count, member in enumerate(_members(archive), start=1):
        if count > MAX_MEMBERS:
            raise SpecError(f"agent bundle has more than {MAX_MEMBERS} members")
        name = _check_member(member)
        total += max(member.size, 0)
        if total > max_unpacked:
            raise SpecError(f"agent bundle unpacks to more than {max_unpacked} bytes")
        if member.isreg() and name:
            files[name] = member
    name = _pick_yaml(files)
    if sub_agent is not None:
        name = _sub_agent_yaml(files, name, sub_agent)
    member = files[name]
    if member.size > MAX_YAML_BYTES:
        raise SpecError(
            f"agent YAML {name!r} is too large: {member.size} bytes (limit {MAX_YAML_BYTES})"
        )
    prompt = None
    children: dict[str, bytes] = {}
    if name.rsplit("/", 1)[-1] == "config.yaml":
        base = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        if f"{base}AGENTS.md" in files and files[f"{base}AGENTS.md"].size <= MAX_YAML_BYTES:
            prompt = _extract(archive, files[f"{base}AGENTS.md"])
        for path, info in files.items():
            child, _, rest = path.removeprefix(f"{base}agents/").partition("/")
            if (
                path.startswith(f"{base}agents/")
                and rest == "config.yaml"
                and SUB_AGENT_NAME.fullmatch(child)
                and info.size <= MAX_YAML_BYTES
            ):
                children[child] = _extract(archive, info)
    return name, _extract(archive, member), prompt, children


def _extract(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    assert handle is not None  # a regular file always has a handle
    return handle.read()


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    try:
        while data:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            chunk = inflater.decompress(data, limit + 1 - len(out))
            out += chunk
            if len(out) > limit:
                raise SpecError(f"agent bundle unpacks to more than {limit} bytes")
            if not inflater.eof:
                if inflater.unconsumed_tail:
                    raise SpecError(f"agent bundle unpacks to more than {limit} bytes")
                raise SpecError("agent bundle is truncated gzip data")
            data = inflater.unused_data.lstrip(b"\x00")
    except zlib.error as exc:
        raise SpecError(f"agent bundle is not valid gzip data: {exc}") from exc
    return bytes(out)


def _members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    try:
        while (member := archive.next()) is not None:
            yield member
    except tarfile.TarError as exc:
        raise SpecError(f"agent bundle is not a valid tar archive: {exc}") from exc


def _check_member(member: tarfile.TarInfo) -> str:
    """The member's normalised path; refuses what is unsafe to unpack anywhere."""
    name = member.name
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hard link"
        raise SpecError(f"agent bundle member {name!r} is a {kind}; links are not allowed")
    if not (member.isreg() or member.isdir()):
        raise SpecError(f"agent bundle member {name!r} is not a regular file or directory")
    if "\x00" in name or "\\" in name:
        raise SpecError(f"agent bundle member {name!r} has an invalid path")
    if name.startswith("/"):
        raise SpecError(f"agent bundle member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SpecError(f"agent bundle member {name!r} escapes the bundle ('..' in its path)")
    return "/".join(parts)


def _sub_agent_yaml(files: dict[str, tarfile.TarInfo], top: str, sub_agent: str) -> str:
    """``agents/<sub_agent>/config.yaml`` beside the bundle's top YAML ``top``."""
    if not SUB_AGENT_NAME.fullmatch(sub_agent):
        raise SpecError(f"invalid sub-agent name {sub_agent[:64]!r}")
    base = top.rsplit("/", 1)[0] + "/" if "/" in top else ""
    name = f"{base}agents/{sub_agent}/config.yaml"
    if name not in files:
        raise SpecError(f"agent bundle has no sub-agent {sub_agent!r} ({name})")
    return name


def _pick_yaml(files: dict[str, tarfile.TarInfo]) -> str:
    yamls = [n for n in files if n.endswith((".yaml", ".yml"))]
    if not yamls:
        raise SpecError("agent bundle holds no agent YAML (*.yaml or *.yml)")
    depth = min(n.count("/") for n in yamls)
    top = sorted(n for n in yamls if n.count("/") == depth)
    if len(top) == 1:
        return top[0]
    for preferred in ("config.yaml", "config.yml", "agent.yaml", "agent.yml"):
        named = [n for n in top if n.rsplit("/", 1)[-1] == preferred]
        if len(named) == 1:
            return named[0]
    raise SpecError(f"agent bundle holds several agent YAML files ({', '.join(top)}); expected one")
