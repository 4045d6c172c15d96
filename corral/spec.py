"""The agent spec: what the runner needs to know about an agent, as typed msgspec Structs.

An omnigent server hands the runner its agents as a bundle (``GET /v1/sessions/{id}/agent/
contents``, PROTOCOL_FACTS §iii.3), in one of omnigent's two formats. The *flat* format is one
YAML file, bundled as it is (``<name>.yaml``)::

    name: proto-tool-021697
    executor:
      harness: openai-agents          # or executor.config.harness
      model: fake-tool-xb0f7b6
      auth: {type: api_key, api_key: mock-key, base_url: http://127.0.0.1:18933/v1}
    os_env: {type: caller_process, cwd: ., sandbox: {type: none}}
    prompt: terse
    policies:                          # name -> {type: function, function: <dotted path>}
      ask_os: {type: function, function: {path: omnigent.policies.builtins.safety.ask_on_os_tools}}

The *directory* format (``spec_version: 1``) is a directory bundled whole: ``config.yaml``
with ``executor: {type: omnigent, model, auth, config: {harness: openai-agents}}``, its
sub-agents in ``agents/<child>/config.yaml`` (named in ``tools: {agents: [child]}``), the
system prompt in ``prompt``/``instructions`` or else an ``AGENTS.md`` beside ``config.yaml``,
and its policies in ``guardrails: {policies: ...}``. :func:`load_bundle` reads the top
``config.yaml``; :func:`load_agent_dir` reads such a directory from disk.
:func:`agent_policies` lists the policies of either format (``policies`` and
``guardrails.policies``), checked for shape; what a policy function does is the server's
business (the embedded control plane knows a few builtins, ``corral/server/_policy.py``).

Agent YAMLs are written for many runners, so two rules pull against each other:

* **Fields corral knows are typed.** A wrong type is an error that names the field, in
  msgspec's words: ``invalid agent spec: Expected str, got int - at $.executor.model``.
* **Fields corral does not know are kept**, not rejected and not dropped. Each section
  (the spec, ``executor``, ``executor.auth``, ``executor.config``, ``os_env``,
  ``os_env.sandbox``) carries the keys it did not recognise in ``extra``, and
  :func:`spec_to_dict` puts them back. Harness workers read tunables such as
  ``executor.max_steps`` or ``executor.headers`` from the dict they are sent, so a round
  trip over the bus must not lose them.

``executor.harness`` is normalised: when only ``executor.config.harness`` is given, it is
copied into ``executor.harness`` (``config`` is kept as it was).

Bundles are untrusted input from the network. :func:`load_bundle` reads them through
:mod:`corral._bundle_files`, which never extracts to disk and still refuses what an extracting
reader would trip on (absolute or ``..`` paths, links, devices), and bounds both the compressed
and the unpacked size, so a gzip bomb costs at most ``max_unpacked`` bytes of memory.

This module is a floor module: it imports nothing from ``corral.actors``, ``corral.server``
or ``corral.cli``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from ._bundle_files import (
    MAX_BUNDLE_BYTES,
    MAX_MEMBERS,
    MAX_UNPACKED_BYTES,
    MAX_YAML_BYTES,
    make_bundle,
    make_bundle_files,
    read_bundle,
)
from ._exceptions import SpecError
from ._jsonlines import JsonObject

__all__ = [
    "MAX_BUNDLE_BYTES",
    "MAX_UNPACKED_BYTES",
    "MAX_YAML_BYTES",
    "AgentDir",
    "AgentSpec",
    "AuthSpec",
    "ExecutorConfig",
    "ExecutorSpec",
    "OsEnvSpec",
    "PolicyRef",
    "SandboxSpec",
    "SpecError",
    "agent_policies",
    "load_agent_dir",
    "load_bundle",
    "load_spec_yaml",
    "make_bundle",
    "make_bundle_files",
    "parse_spec",
    "spec_to_dict",
]

#: Most nodes a YAML document may expand to (aliases counted each time they are used), so an
#: alias bomb ("billion laughs") is refused before anything walks it.
MAX_YAML_NODES = 200_000

#: Wire name of the ``extra`` field. Nobody writes this key in an agent YAML; it only exists so
#: the field has a name of its own (the keys it holds are written back at the section's level).
_EXTRA = "__corral_extra__"

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A mapping of the spec: typed known fields, plus the unknown keys kept in ``extra``."""

    extra: JsonObject = msgspec.field(default_factory=dict, name=_EXTRA)


class AuthSpec(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """``executor.auth``: how the harness authenticates to its model provider.

    ``api_key`` may be a literal or a ``$VAR`` reference that the host expands; it is masked
    in ``repr()`` so a logged spec does not leak it.
    """

    type: str | None = None
    api_key: str | None = None
    base_url: str | None = None

    def __repr__(self) -> str:
        key = None if self.api_key is None else "***"
        return f"AuthSpec(type={self.type!r}, api_key={key!r}, base_url={self.base_url!r})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [
            ("type", self.type),
            ("api_key", None if self.api_key is None else "***"),
            ("base_url", self.base_url),
        ]


class ExecutorConfig(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """``executor.config``: the omnigent-style place for ``harness`` (and runner options)."""

    harness: _Name | None = None


class ExecutorSpec(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """``executor``: which harness runs the agent, on which model, with which credentials.

    ``script`` is the free-form script of the ``scripted`` harness
    (``docs/scripted-harness.md``); that harness validates it.
    """

    type: str | None = None
    harness: _Name | None = None
    config: ExecutorConfig | None = None
    model: str | None = None
    auth: AuthSpec | None = None
    script: JsonObject | None = None

    def __post_init__(self) -> None:
        if self.harness is None and self.config is not None and self.config.harness:
            msgspec.structs.force_setattr(self, "harness", self.config.harness)


class SandboxSpec(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """``os_env.sandbox``: how tool execution is isolated (``type: none`` for no sandbox).

    On Linux, ``linux_bwrap``, ``bwrap``, ``bubblewrap`` and ``os_sandbox`` run the session's
    commands in bubblewrap, with ``allow_network``, ``read_paths``, ``write_paths`` and
    ``write_files`` from ``extra`` (:func:`corral._child_env.sandbox_of` reads them; a type or
    field the host cannot honour is refused, never run without: docs/tools.md). Every other
    field is kept in ``extra`` untouched (T-11).
    """

    type: str | None = None


class OsEnvSpec(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """``os_env``: the OS environment the agent's tools run in.

    ``type`` is e.g. ``caller_process``; ``cwd`` is relative to the session's workspace.
    ``sandbox`` may also be a bare string (``sandbox: none``).
    """

    type: str | None = None
    cwd: str | None = None
    sandbox: SandboxSpec | str | None = None


class AgentSpec(_Section, frozen=True, kw_only=True, omit_defaults=True):
    """An agent, as the runner needs it.

    ``prompt`` and ``instructions`` are two spellings of the system prompt (omnigent agent
    YAMLs use ``prompt``); :attr:`system_prompt` picks one. ``os_env`` may be the string
    ``inherit`` in a sub-agent. ``terminals``, ``tools`` and ``sub_agents`` are free-form
    lists or mappings whose entries the owning actor interprets. ``agent_session_sharing`` is
    one of ``none``, ``non-public``, ``public``. ``spec_version`` marks omnigent's directory
    format; ``policies`` (flat format) and ``guardrails.policies`` (directory format) map a
    policy name to its definition, read with :func:`agent_policies`.
    """

    spec_version: int | None = None
    name: _Name | None = None
    executor: ExecutorSpec | None = msgspec.field(default_factory=ExecutorSpec)
    prompt: str | None = None
    instructions: str | None = None
    os_env: OsEnvSpec | str | None = None
    terminals: list[Any] | JsonObject | None = None
    tools: list[Any] | JsonObject | None = None
    sub_agents: list[Any] | JsonObject | None = None
    spawn: bool | None = None
    agent_session_sharing: Literal["none", "non-public", "public"] | None = None
    policies: JsonObject | None = None
    guardrails: JsonObject | None = None

    def __post_init__(self) -> None:
        if self.executor is None:  # ``executor:`` left empty in the YAML
            msgspec.structs.force_setattr(self, "executor", ExecutorSpec())

    @property
    def harness(self) -> str | None:
        """``executor.harness`` (or ``executor.config.harness``), if the spec names one."""
        return self.executor.harness if self.executor is not None else None

    @property
    def model(self) -> str | None:
        """``executor.model``, if set."""
        return self.executor.model if self.executor is not None else None

    @property
    def system_prompt(self) -> str | None:
        """``prompt`` if set, else ``instructions``."""
        return self.prompt if self.prompt is not None else self.instructions


def parse_spec(data: Any) -> AgentSpec:
    """Validate a decoded agent spec (a mapping, e.g. from YAML or the bus).

    Raises:
        SpecError: naming the field, e.g. ``invalid agent spec: Expected str, got int - at
            $.executor.model``; ``path`` is ``$.executor.model``.
    """
    _check_expansion(data, MAX_YAML_NODES)
    try:
        spec = msgspec.convert(data, AgentSpec)
    except msgspec.ValidationError as exc:
        # msgspec's words, without its backticks, and "str" rather than "str | null": every
        # field may be left out or null, so saying so on each error is noise.
        text = str(exc).replace("`", "")
        text = re.sub(r"^(Expected .*?) \| null\b", r"\1", text)
        match = re.search(r" - at (?:key in )?(\$\S*)$", text)
        raise SpecError(
            f"invalid agent spec: {text}", path=match.group(1) if match else "$"
        ) from exc
    return _with_extras(spec, data)


def spec_to_dict(spec: AgentSpec) -> JsonObject:
    """The spec as plain builtins, unknown keys included: ``parse_spec(spec_to_dict(s)) == s``.

    Fields left at their default are omitted. Values YAML decoded to non-JSON types (dates)
    come back as strings, so the dict encodes as JSON or msgpack.
    """
    return msgspec.to_builtins(_section_to_dict(spec))


def load_spec_yaml(text: str | bytes) -> AgentSpec:
    """Parse one agent YAML document.

    Raises:
        SpecError: the YAML does not parse (with line and column), is not a mapping, is over
            :data:`MAX_YAML_BYTES`, or does not validate (naming the field).
    """
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_YAML_BYTES:
        raise SpecError(f"agent YAML is too large: {size} bytes (limit {MAX_YAML_BYTES})")
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = ""
        if exc.problem_mark is not None:
            where = f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        raise SpecError(f"invalid agent YAML: {exc.problem or exc}{where}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid agent YAML: {exc}") from exc
    except RecursionError as exc:
        raise SpecError("invalid agent YAML: nested too deeply") from exc
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise SpecError(f"invalid agent spec: expected a mapping at the top, got {kind}", path="$")
    return parse_spec(data)


def load_bundle(
    data: bytes,
    *,
    max_bytes: int = MAX_BUNDLE_BYTES,
    max_unpacked: int = MAX_UNPACKED_BYTES,
    sub_agent: str | None = None,
) -> AgentSpec:
    """Parse an agent bundle: a tar.gz holding one agent YAML (plus files it may ignore).

    The YAML is ``config.yaml`` (or ``agent.yaml``) at the shallowest level that holds YAML
    files, else the only ``*.yaml``/``*.yml`` file there. With ``sub_agent``, the spec is
    that sub-agent's, ``agents/<sub_agent>/config.yaml`` beside it: a child session of a
    directory agent is served its parent's whole bundle (PROTOCOL_0_19.md §J) and names its
    sub-agent in ``sub_agent_name``.

    Raises:
        SpecError: the bundle is too large (compressed or unpacked), not gzip, not a tar
            archive, has an absolute or ``..`` member path, a link or device member, holds no
            YAML or several candidates, or its YAML is invalid.
    """
    name, content, prompt, children = read_bundle(
        data, max_bytes=max_bytes, max_unpacked=max_unpacked, sub_agent=sub_agent
    )
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"agent YAML {name!r} is not UTF-8 text") from exc
    spec = load_spec_yaml(text)
    if spec.system_prompt is None and prompt is not None:
        # A directory-format agent may keep its prompt in AGENTS.md beside config.yaml.
        spec = msgspec.structs.replace(spec, instructions=prompt.decode("utf-8", "replace"))
    return _with_children(spec, children)


def _with_children(spec: AgentSpec, children: dict[str, bytes]) -> AgentSpec:
    """``spec`` with the directory children beside it (``agents/<name>/config.yaml``) among its
    ``sub_agents``, each as ``{name, executor}``, where the spec does not list that name: the
    tools check a model override against a sub-agent's harness and provider (S-10, P-11..P-15)
    from there. A child whose YAML does not parse is left out (its own session reports it)."""
    listed = spec.sub_agents
    found: list[JsonObject] = []
    for child, text in sorted(children.items()):
        if _lists_sub_agent(listed, child):
            continue
        try:
            executor = spec_to_dict(load_spec_yaml(text.decode("utf-8"))).get("executor")
        except (SpecError, UnicodeDecodeError):
            continue
        found.append({"name": child, "executor": executor or {}})
    if not found:
        return spec
    if isinstance(listed, dict):
        merged: list[Any] | JsonObject = {**listed, **{f["name"]: f for f in found}}
    else:
        merged = [*(listed or []), *found]
    return msgspec.structs.replace(spec, sub_agents=merged)


def _lists_sub_agent(sub_agents: list[Any] | JsonObject | None, name: str) -> bool:
    if isinstance(sub_agents, dict):
        return name in sub_agents
    return any(isinstance(e, dict) and e.get("name") == name for e in sub_agents or [])


class PolicyRef(msgspec.Struct, frozen=True, kw_only=True):
    """One policy of an agent: its name, where it was declared, the function it calls.

    ``arguments`` are the factory arguments (``function: {path, arguments}`` or a sibling
    ``factory_params``); None for a policy that is the function itself.
    """

    name: str
    where: str
    path: str
    arguments: JsonObject | None = None


def agent_policies(spec: AgentSpec) -> list[PolicyRef]:
    """The agent's policies in declaration order: ``policies`` first, then
    ``guardrails.policies`` (omnigent reads the first in flat files, the second in
    directories; corral honours both, so a policy is never silently dropped).

    Only ``type: function`` (the default of omnigent's flat loader) is a policy corral can
    apply; the function is ``function:`` (a dotted path, or ``{path, arguments}``) or one of
    its aliases ``handler:`` and ``callable:``.

    Raises:
        SpecError: a policy that is not such a mapping, naming it and its path in the spec.
    """
    sections: list[tuple[str, Any]] = [("$.policies", spec.policies)]
    if spec.guardrails is not None:
        sections.append(("$.guardrails.policies", spec.guardrails.get("policies")))
    refs: list[PolicyRef] = []
    for where, section in sections:
        if section is None:
            continue
        if not isinstance(section, dict):
            raise SpecError(
                f"invalid agent spec: {where[2:]} must be a mapping of policy name to policy, "
                f"got {type(section).__name__}",
                path=where,
            )
        for name, entry in section.items():
            refs.append(_policy_ref(str(name), entry, f"{where}.{name}"))
    return refs


def _policy_ref(name: str, entry: Any, where: str) -> PolicyRef:
    def bad(problem: str) -> SpecError:
        return SpecError(f"invalid agent spec: policy {name!r}: {problem}", path=where)

    if not isinstance(entry, dict):
        raise bad(f"must be a mapping, got {type(entry).__name__}")
    kind = entry.get("type", "function")
    if kind != "function":
        raise bad(f"type must be 'function', got {kind!r}")
    function = entry.get("function") or entry.get("handler") or entry.get("callable")
    arguments = None
    if isinstance(function, dict):
        arguments = function.get("arguments")
        function = function.get("path")
    if not isinstance(function, str) or not function:
        raise bad("needs `function:` (a dotted path, or {path, arguments})")
    params = entry.get("factory_params")
    if params is not None:
        if arguments is not None:
            raise bad("give factory arguments in function.arguments or factory_params")
        arguments = params
    if arguments is not None and not isinstance(arguments, dict):
        raise bad(f"factory arguments must be a mapping, got {type(arguments).__name__}")
    return PolicyRef(name=name, where=where, path=function, arguments=arguments)


class AgentDir(msgspec.Struct, frozen=True, kw_only=True):
    """A directory-format agent read from disk: its spec, its sub-agents' specs by directory
    name, and every file of the directory (for its bundle)."""

    spec: AgentSpec
    config_text: str
    children: dict[str, AgentSpec]
    files: dict[str, bytes]


#: Names never bundled from an agent directory (caches and version control).
_SKIPPED_NAMES = frozenset({"__pycache__", ".git", ".hg", ".svn"})


def load_agent_dir(root: Path) -> AgentDir:
    """Read a directory-format agent: ``config.yaml``, ``agents/<child>/config.yaml``, and
    every other file under it (symlinks and caches left out), bounded as a bundle is.

    Raises:
        SpecError: no ``config.yaml``, a YAML that does not parse or validate (naming the
            file), a non-UTF-8 ``config.yaml``, or more files or bytes than a bundle allows.
        OSError: the directory cannot be read.
    """
    files = _read_tree(root)
    if "config.yaml" not in files:
        raise SpecError(f"{root} has no config.yaml")
    spec, text = _dir_spec(files, "", root)
    children: dict[str, AgentSpec] = {}
    for name in sorted({p.split("/")[1] for p in files if p.startswith("agents/")}):
        if f"agents/{name}/config.yaml" in files:
            children[name] = _dir_spec(files, f"agents/{name}/", root)[0]
    return AgentDir(spec=spec, config_text=text, children=children, files=files)


def _dir_spec(files: dict[str, bytes], prefix: str, root: Path) -> tuple[AgentSpec, str]:
    where = root / f"{prefix}config.yaml"
    try:
        text = files[f"{prefix}config.yaml"].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where} is not UTF-8 text") from exc
    try:
        spec = load_spec_yaml(text)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}", path=exc.path) from exc
    if spec.system_prompt is None and f"{prefix}AGENTS.md" in files:
        # omnigent's directory format takes the prompt from AGENTS.md when config.yaml
        # gives none.
        prompt = files[f"{prefix}AGENTS.md"].decode("utf-8", "replace")
        spec = msgspec.structs.replace(spec, instructions=prompt)
    return spec, text


def _read_tree(root: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _SKIPPED_NAMES for part in rel.parts) or path.is_symlink():
            continue
        if not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        if len(files) >= MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
            raise SpecError(
                f"{root} is too large for an agent bundle "
                f"(limits: {MAX_MEMBERS} files, {MAX_UNPACKED_BYTES} bytes)"
            )
        files[rel.as_posix()] = data
    return files


# -- internals ------------------------------------------------------------------------------


def _with_extras(section: Any, raw: Any) -> Any:
    """Copy of ``section`` whose ``extra`` (and its sub-sections') hold ``raw``'s unknown keys."""
    if not isinstance(section, _Section) or not isinstance(raw, dict):
        return section
    known = set()
    changes: dict[str, object] = {}
    for field in msgspec.structs.fields(section):
        if field.name == "extra":
            continue
        known.add(field.encode_name)
        value = getattr(section, field.name)
        if isinstance(value, _Section) and field.encode_name in raw:
            changes[field.name] = _with_extras(value, raw[field.encode_name])
    changes["extra"] = {k: v for k, v in raw.items() if k not in known and k != _EXTRA}
    return msgspec.structs.replace(section, **changes)


def _section_to_dict(section: _Section) -> JsonObject:
    out: JsonObject = {}
    for field in msgspec.structs.fields(section):
        if field.name == "extra":
            continue
        value = getattr(section, field.name)
        default = (
            field.default_factory()
            if field.default_factory is not msgspec.NODEFAULT
            else field.default
        )
        if value == default:
            continue
        out[field.encode_name] = _section_to_dict(value) if isinstance(value, _Section) else value
    for key, value in section.extra.items():
        out.setdefault(key, value)
    return out


def _check_expansion(data: Any, budget: int) -> None:
    """Refuse a structure that expands to more than ``budget`` nodes (YAML alias bombs)."""
    stack = [data]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > budget:
            raise SpecError(f"agent spec is too large: more than {budget} values once expanded")
        if isinstance(node, dict):
            stack.extend(node.values())
            seen += len(node)
        elif isinstance(node, list | tuple | set):
            stack.extend(node)
