"""Runner identities: which runner ids this host serves, resolved once for every actor.

A ``[[runners]]`` table names its id, or gives a token the id is derived from (PROTOCOL_FACTS
§i.1), or neither — then the host makes up a stable id and keeps it in the state dir, so a
restart serves the same runner. The host resolves ids before it starts its children and
hands every actor that talks to servers (gateway, dispatch, policy) the same list.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import msgspec

from ._exceptions import ConfigError
from ._jsonlines import write_atomically
from .config import RunnerSettings
from .server_client import runner_id_for_token

#: Where made-up runner ids are kept, under the state dir.
IDS_FILE = "runner-ids.json"


def resolve_runner_ids(runners: list[RunnerSettings], state_dir: Path) -> list[RunnerSettings]:
    """``runners`` with every ``id`` filled in (configured, derived, or stored).

    Raises:
        ConfigError: when two runners end up with the same id.
    """
    path = state_dir / IDS_FILE
    try:
        stored: dict[str, str] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        stored = {}
    out: list[RunnerSettings] = []
    unnamed: dict[str, int] = {}
    changed = False
    for runner in runners:
        if runner.id:
            runner_id = runner.id
        elif runner.token:
            runner_id = runner_id_for_token(runner.token)
        else:
            n = unnamed[runner.server] = unnamed.get(runner.server, 0) + 1
            key = f"{runner.server}#{n}"
            if key not in stored:
                stored[key] = f"runner_{uuid.uuid4().hex}"
                changed = True
            runner_id = stored[key]
        out.append(msgspec.structs.replace(runner, id=runner_id))
    if changed:
        state_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(stored, indent=1).encode())
    ids = [r.id for r in out]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise ConfigError(f"two runners have the id {dup!r}", key="runners")
    return out
