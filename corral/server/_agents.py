"""The agents the control plane offers: every agent in the packaged and configured dirs.

Agents are read from ``corral/server/agents/`` (shipped with the package) and then from each
``[server].agents_dirs`` entry, so a user's agent of the same name replaces a shipped one.
Both of omnigent's formats are read unchanged (``corral.spec`` describes them): each
``*.yaml``/``*.yml`` file is a flat agent, each subdirectory holding a ``config.yaml`` is a
directory agent (with its ``agents/<child>/`` sub-agents), bundled whole as the real server
does. Each file is checked strictly first (:mod:`corral.agent_files`: unknown keys, wrong
types, a harness the runner does not run, with lines and "did you mean"). An agent whose file
fails that check or does not parse, or whose policies name a function this server cannot
run, is skipped, never fatal, because one bad file in a directory of agents must not take
the server (and every other agent) down: it is logged once, listed with its problems
(``GET /v1/agents``'s ``invalid``, which ``corral agents`` shows), and asking for it by name
says why it is missing.

An agent's id is derived from its name, so it stays the same across restarts and edits; its
version is a hash of its files, so the runner sees a new ``x-agent-version`` when one changes
(PROTOCOL_FACTS §iii.3).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Collection
from pathlib import Path

import msgspec
import yaml

from .._exceptions import SpecError
from ..agent_files import Problem, check_agent_file
from ..spec import (
    MAX_YAML_BYTES,
    AgentSpec,
    load_agent_dir,
    load_spec_yaml,
    make_bundle,
    make_bundle_files,
)
from ._policy import AgentPolicy, policies_of

__all__ = [
    "PACKAGED_AGENTS",
    "Agent",
    "AgentCatalog",
    "Skipped",
    "agent_id_for",
    "load_agent",
    "spec_policies",
    "yaml_version",
]

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
    """One loaded agent: its spec and YAML text (a directory agent's ``config.yaml``), its
    policies bound to the builtins they name, and for a directory agent every file of it."""

    name: str
    agent_id: str
    yaml_text: str
    spec: AgentSpec
    path: str
    policies: list[AgentPolicy] = []
    files: dict[str, bytes] | None = None
    sub_agents: list[str] = []

    @property
    def version(self) -> str:
        """A hash of the agent's files (``x-agent-version``)."""
        if self.files is None:
            return yaml_version(self.yaml_text)
        digest = hashlib.sha256()
        for name in sorted(self.files):
            digest.update(f"{name}\0{len(self.files[name])}\0".encode())
            digest.update(self.files[name])
        return digest.hexdigest()[:16]

    def bundle(self) -> bytes:
        """The agent as the runner fetches it: the file itself, or the whole directory."""
        if self.files is None:
            return make_bundle(self.yaml_text, filename=Path(self.path).name)
        return make_bundle_files(self.files)

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
        if self.sub_agents:
            entry["sub_agents"] = self.sub_agents
        if self.policies:
            entry["policies"] = [p.name for p in self.policies]
        return entry


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    """An agent file that was not loaded: where, why (``reason``: all of it, in one line;
    ``problems``: each, as :meth:`corral.agent_files.Problem.to_dict`), and the agent name
    if it is known."""

    path: str
    reason: str
    name: str | None = None
    problems: list[dict[str, object]] = []

    def listing(self) -> dict[str, object]:
        """The file as ``GET /v1/agents`` lists it under ``invalid``."""
        return {
            "path": self.path,
            "name": self.name,
            "error": self.reason,
            "problems": self.problems,
        }


class AgentCatalog:
    """Loads agents from directories; :meth:`load` is blocking (call it in a thread)."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.agents: dict[str, Agent] = {}
        #: path -> why it was skipped, from the last load (for logs and status).
        self.skipped: dict[str, Skipped] = {}
        self._warned: set[tuple[str, str]] = set()

    def why_missing(self, name: str) -> str | None:
        """Why an agent of this name (or file/directory stem) was skipped, if one was."""
        for skipped in self.skipped.values():
            if name in (skipped.name, Path(skipped.path).stem):
                reason = skipped.reason
                return reason if reason.startswith(skipped.path) else f"{skipped.path}: {reason}"
        return None

    def load(self, harnesses: Collection[str] | None = None) -> dict[str, Agent]:
        """Re-read every directory; returns (and keeps) the agents by name.

        ``harnesses``: the harness names the runner runs (None: not known, not checked).
        """
        agents: dict[str, Agent] = {}
        skipped: dict[str, Skipped] = {}
        for directory in self.dirs:
            if not directory.is_dir():
                if directory != PACKAGED_AGENTS:
                    self._warn_once(str(directory), "is not a directory; no agents read from it")
                continue
            seen_here: set[str] = set()
            entries = sorted(
                p
                for p in directory.iterdir()
                if (p.suffix in (".yaml", ".yml") and p.is_file())
                or (p.is_dir() and (p / "config.yaml").is_file())
            )
            for path in entries:
                agent = load_agent(path, harnesses)
                if isinstance(agent, Skipped):
                    skipped[str(path)] = agent
                    self._warn_once(str(path), f"skipped: {agent.reason}")
                    continue
                if agent.name in seen_here:
                    reason = f"a second agent named {agent.name!r} in the same directory"
                    skipped[str(path)] = Skipped(path=str(path), reason=reason, name=agent.name)
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


class _Rejected(Exception):
    """The spec parsed (so the agent's name is known) but the agent cannot be served."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason


def _policies(name: str, spec: AgentSpec, where: str = "") -> list[AgentPolicy]:
    try:
        return policies_of(spec)
    except SpecError as exc:
        # Never served with a policy dropped: an agent whose policy cannot run is no agent.
        raise _Rejected(name, f"{where}{exc}") from exc


class _Invalid(Exception):
    """The agent file fails the strict check (:mod:`corral.agent_files`)."""

    def __init__(self, skipped: Skipped) -> None:
        super().__init__(skipped.reason)
        self.skipped = skipped


def load_agent(path: Path, harnesses: Collection[str] | None = None) -> Agent | Skipped:
    """The agent at ``path`` (a YAML file, or a directory with a ``config.yaml``), or why it
    cannot be served: its files fail the strict check (every problem, with its line), its
    spec does not parse, a policy names a function this server cannot run, or it cannot be
    read. ``harnesses``: the harness names the runner runs (None: not checked)."""
    try:
        return _load_dir(path, harnesses) if path.is_dir() else _load_file(path, harnesses)
    except _Invalid as exc:
        # Its name, if the YAML says it, so that asking for the agent by name says why not.
        return msgspec.structs.replace(exc.skipped, name=_name_in(path))
    except _Rejected as exc:
        return Skipped(path=str(path), reason=exc.reason, name=exc.name)
    except (OSError, UnicodeDecodeError, SpecError) as exc:
        return Skipped(path=str(path), reason=str(exc))


def _name_in(path: Path) -> str | None:
    """The ``name`` an agent file (a directory's ``config.yaml``) gives, if it parses."""
    try:
        text = (path / "config.yaml" if path.is_dir() else path).read_bytes()
        data = yaml.safe_load(text) if len(text) <= MAX_YAML_BYTES else None
    except (OSError, yaml.YAMLError, RecursionError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


def _check(root: Path, files: list[Path], harnesses: Collection[str] | None) -> None:
    """Check each of ``files`` (those of the agent at ``root``) strictly.

    Raises:
        _Invalid: naming every problem of every file, with its line.
    """
    found: list[tuple[Path, Problem]] = []
    for file in files:
        found += [(file, problem) for problem in check_agent_file(file, harnesses)]
    if found:
        texts = [problem.text(file) for file, problem in found]
        more = f" (and {len(texts) - 1} more)" if len(texts) > 1 else ""
        problems = [problem.to_dict(file) for file, problem in found]
        raise _Invalid(Skipped(path=str(root), reason=texts[0] + more, problems=problems))


def _load_file(path: Path, harnesses: Collection[str] | None = None) -> Agent:
    _check(path, [path], harnesses)
    text = path.read_text(encoding="utf-8")
    spec = load_spec_yaml(text)
    name = spec.name or path.stem
    return Agent(
        name=name,
        agent_id=agent_id_for(name),
        yaml_text=text,
        spec=spec,
        path=str(path),
        policies=_policies(name, spec),
    )


def _load_dir(path: Path, harnesses: Collection[str] | None = None) -> Agent:
    children = sorted((path / "agents").glob("*/config.yaml"))
    _check(path, [path / "config.yaml", *children], harnesses)
    tree = load_agent_dir(path)
    name = tree.spec.name or path.name
    policies = _policies(name, tree.spec)
    for child, spec in tree.children.items():
        _policies(name, spec, f"sub-agent {child!r}: ")
    return Agent(
        name=name,
        agent_id=agent_id_for(name),
        yaml_text=tree.config_text,
        spec=tree.spec,
        path=str(path),
        policies=policies,
        files=tree.files,
        sub_agents=sorted(tree.children),
    )


def spec_policies(yaml_text: str) -> list[AgentPolicy]:
    """The policies of a stored agent YAML (a session's copy taken at creation).

    Raises:
        SpecError: the YAML or one of its policies is invalid.
    """
    return policies_of(load_spec_yaml(yaml_text))
