"""The agents the control plane offers: every agent YAML in the packaged and configured dirs.

Agents are read from ``corral/server/agents/`` (shipped with the package) and then from each
``[server].agents_dirs`` entry, so a user's agent of the same name replaces a shipped one.
Each ``*.yaml``/``*.yml`` file is parsed with :func:`corral.spec.load_spec_yaml`; a file that
does not parse is logged with the reason and skipped, never fatal, because one bad file in a
directory of agents must not take the server (and every other agent) down.

An agent's id is derived from its name, so it stays the same across restarts and edits; its
version is a hash of the YAML text, so the runner sees a new ``x-agent-version`` when the file
changes (PROTOCOL_FACTS §iii.3).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from pathlib import Path

import msgspec

from .._exceptions import SpecError
from ..spec import AgentSpec, load_spec_yaml

__all__ = ["PACKAGED_AGENTS", "Agent", "AgentCatalog", "agent_id_for"]

log = logging.getLogger("corral.server.agents")

#: The directory of agents shipped with corral.
PACKAGED_AGENTS = Path(__file__).parent / "agents"
_NAMESPACE = uuid.UUID("5b0d7a52-6f0e-4a39-9d0c-3f1c2a7e8b41")


def agent_id_for(name: str) -> str:
    """The stable agent id of an agent name (32 hex characters, like the server's ids)."""
    return uuid.uuid5(_NAMESPACE, name).hex


def yaml_version(yaml_text: str) -> str:
    """The ``x-agent-version`` of a YAML text: changes whenever the text does."""
    return hashlib.sha256(yaml_text.encode()).hexdigest()[:16]


class Agent(msgspec.Struct, frozen=True, kw_only=True):
    """One loaded agent."""

    name: str
    agent_id: str
    yaml_text: str
    spec: AgentSpec
    path: str

    @property
    def version(self) -> str:
        """A hash of the YAML text (``x-agent-version``)."""
        return yaml_version(self.yaml_text)

    def listing(self) -> dict[str, object]:
        """The agent as ``GET /v1/agents`` shows it."""
        entry: dict[str, object] = {
            "name": self.name,
            "harness": self.spec.harness,
            "model": self.spec.model,
            "agent_id": self.agent_id,
        }
        description = self.spec.extra.get("description")
        if isinstance(description, str):
            entry["description"] = description
        return entry


class AgentCatalog:
    """Loads agents from directories; :meth:`load` is blocking (call it in a thread)."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.agents: dict[str, Agent] = {}
        #: path -> the reason it was skipped, from the last load (for logs and status).
        self.skipped: dict[str, str] = {}
        self._warned: set[tuple[str, str]] = set()

    def load(self) -> dict[str, Agent]:
        """Re-read every directory; returns (and keeps) the agents by name."""
        agents: dict[str, Agent] = {}
        skipped: dict[str, str] = {}
        for directory in self.dirs:
            if not directory.is_dir():
                if directory != PACKAGED_AGENTS:
                    self._warn_once(str(directory), "is not a directory; no agents read from it")
                continue
            seen_here: set[str] = set()
            files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
            for path in files:
                try:
                    agent = _load_file(path)
                except (OSError, UnicodeDecodeError, SpecError) as exc:
                    skipped[str(path)] = str(exc)
                    self._warn_once(str(path), f"skipped: {exc}")
                    continue
                if agent.name in seen_here:
                    reason = f"a second agent named {agent.name!r} in the same directory"
                    skipped[str(path)] = reason
                    self._warn_once(str(path), f"skipped: {reason}")
                    continue
                seen_here.add(agent.name)
                if agent.name in agents:
                    log.info(
                        "agent %r from %s replaces %s", agent.name, path, agents[agent.name].path
                    )
                agents[agent.name] = agent
        self.agents = agents
        self.skipped = skipped
        return agents

    def _warn_once(self, path: str, message: str) -> None:
        # Listing agents reloads them; an unchanged bad file is reported once, not per listing.
        if (path, message) not in self._warned:
            self._warned.add((path, message))
            log.warning("agent file %s %s", path, message)


def _load_file(path: Path) -> Agent:
    text = path.read_text(encoding="utf-8")
    spec = load_spec_yaml(text)
    name = spec.name or path.stem
    return Agent(name=name, agent_id=agent_id_for(name), yaml_text=text, spec=spec, path=str(path))
