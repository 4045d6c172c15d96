"""Agent files, checked strictly: every key known, every value of its type, the harness one
the runner runs, each problem with its line and a "did you mean" for a near miss.

:mod:`corral.spec` reads agent specs leniently on purpose: a bundle a foreign server sends
may carry keys of a newer omnigent, and dropping them would change the agent. An agent
*file* that corral's own control plane serves, or that ``corral agents validate`` checks, is
read strictly instead, because there a typo (``exector:``, ``modle:``) is the user's and
would otherwise surface only at the turn, as a missing harness or model.

The schema is the union of what omnigent 0.19.1 reads from an agent YAML — its single-file
loader (``omnigent.inner.loader``: the keys ``_parse_agent_def``, ``_parse_executor_spec``,
``_parse_os_env_spec``, ``_parse_os_env_sandbox_spec`` read, plus the ``executor`` keys its
translator takes from the raw YAML: ``extra``, ``use_responses``, ``reasoning_item_id_policy``,
``acp_agent``) and its directory format (``omnigent.spec.parser.parse``: ``spec_version``,
``llm``, ``interaction``, ``compaction``, ``guardrails``, ``skills``, ``description``, and
``executor.type/config/connection/...``) — and of what corral's harnesses read besides
(``executor.script`` of the scripted harness; ``api``, ``base_url``, ``headers``,
``extra_body`` and the tunables of the OpenAI one; ``permission_mode``, ``system_prompt`` and
the tunables of claude-sdk: docs/harnesses.md). A harness that reads a new ``executor`` key
adds it to :data:`EXECUTOR` (``tests/unit/test_agent_files.py`` checks the tunables).
Sections whose entries are the harness's or the tools' business (``tools``, ``terminals``,
``policies``, ``executor.config``, ...) are checked for their type only.

A problem is a :class:`Problem`: the dotted key, the 1-based line (of the key, or of the
value whose type is wrong) and the message, e.g.
``agents/helper.yaml:3: exector: unknown key (did you mean executor?)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .spec import MAX_YAML_BYTES

__all__ = [
    "AGENT",
    "EXECUTOR",
    "Problem",
    "check_agent_file",
    "check_agent_text",
    "near",
]

#: A value's allowed YAML kinds: ``str``, ``int``, ``float``, ``bool``, ``null``, ``map``,
#: ``list``, or ``any``; a mapping is a section whose keys are checked in turn.
Schema = dict[str, "tuple[str, ...] | Schema"]

_SCALAR = ("str", "int", "float", "bool")
_NUMBER = ("int", "float")

AUTH: Schema = {
    "type": ("str",),
    "api_key": ("str",),
    "base_url": ("str",),
    "name": ("str",),
    "profile": ("str",),
}

#: ``executor``: omnigent's keys (both formats), then corral's harnesses' own.
EXECUTOR: Schema = {
    # omnigent, single-file format
    "harness": ("str",),
    "model": ("str",),
    "profile": ("str",),
    "auth": AUTH,
    "context_files": ("bool",),
    "system_prompt_mode": ("str",),
    "extra": ("map",),
    "use_responses": ("bool",),
    "reasoning_item_id_policy": ("str",),
    "acp_agent": ("any",),
    # omnigent, directory format (``type: omnigent`` with ``config: {harness: ...}``)
    "type": ("str",),
    "config": ("map",),
    "connection": ("map", "str"),
    "context_window": _NUMBER,
    "max_iterations": ("int",),
    "reasoning_effort": ("str",),
    "timeout": _NUMBER,
    # corral: the scripted harness's script (docs/scripted-harness.md)
    "script": ("map",),
    # corral: the OpenAI harness (docs/harnesses.md)
    "api": ("str",),
    "base_url": ("str",),
    "headers": ("map",),
    "extra_body": ("map",),
    "max_steps": ("int",),
    "max_attempts": ("int",),
    "backoff_base_s": _NUMBER,
    "backoff_max_s": _NUMBER,
    "idle_timeout_s": _NUMBER,
    "turn_timeout_s": _NUMBER,
    # corral: the claude-sdk harness (docs/harnesses.md)
    "permission_mode": ("str",),
    "system_prompt": ("str",),
    "max_retries": ("int",),
}

SANDBOX: Schema = {
    "type": ("str", "null"),
    "read_paths": ("list",),
    "write_paths": ("list",),
    "write_files": ("list",),
    "allow_network": ("bool",),
    "cwd_allow_hidden": ("list", "bool"),
    "cwd_hidden_scan_max_entries": ("int",),
    "cwd_hidden_scan_overflow": ("str",),
    "cwd_hidden_scan_recursive": ("bool",),
    "mask_paths": ("list",),
    "env_passthrough": ("list",),
    "egress_rules": ("list",),
    "egress_allow_private_destinations": ("bool",),
    "credential_proxy": ("map", "list"),
    "git_ssh": ("map", "list", "bool"),
}

OS_ENV: Schema = {
    "type": ("str",),
    "cwd": ("str",),
    "sandbox": SANDBOX,
    "fork": ("bool",),
    "start_in_scratch": ("bool",),
}

#: The top of an agent file.
AGENT: Schema = {
    # both formats
    "name": ("str",),
    "description": ("str",),
    "prompt": ("str",),
    "instructions": ("str",),
    "executor": EXECUTOR,
    "os_env": OS_ENV,
    "tools": ("map", "list"),
    "terminals": ("map", "list"),
    "params": ("map",),
    "model_egress": ("list",),
    "async": ("bool",),
    "timers": ("bool",),
    "spawn": ("bool",),
    "agent_session_sharing": ("str",),
    # omnigent, single-file format
    "async_enabled": ("bool",),
    "cancellable": ("bool",),
    "runtime": ("bool", "str", "map"),
    "input_type": ("any",),
    "output_type": ("any",),
    "policies": ("map",),
    "memories": ("map",),
    "labels": ("map",),
    "ask_timeout": (*_NUMBER, "null"),
    "label_schema": ("map",),
    "policy_transparency": ("bool",),
    "workflow": ("any",),
    "metadata": ("map",),
    # omnigent, directory format
    "spec_version": ("int",),
    "llm": ("map",),
    "interaction": ("map",),
    "compaction": ("map", "bool"),
    "guardrails": ("map",),
    "skills": ("str", "list"),
    # corral: sub-agents declared inline, MCP servers listed by the control plane, a
    # scripted harness's script at the top (docs/scripted-harness.md)
    "sub_agents": ("map", "list"),
    "mcp_servers": ("list", "map"),
    "script": ("map",),
}

#: Values a section may also take instead of a mapping (``os_env: inherit``,
#: ``sandbox: none``, ``sandbox: false``).
_SECTION_ALSO = {"os_env": ("str",), "os_env.sandbox": ("str", "bool")}

_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "null": "null",
    "map": "a mapping",
    "list": "a list",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an agent file: where (the dotted key, the 1-based line) and what."""

    key: str
    line: int | None
    message: str

    def text(self, file: str | Path | None = None) -> str:
        """``file:line: key: message`` (each part left out when unknown)."""
        where = ":".join(str(p) for p in (file, self.line) if p is not None)
        body = f"{self.key}: {self.message}" if self.key else self.message
        return f"{where}: {body}" if where else body

    def to_dict(self, file: str | Path | None = None) -> dict[str, Any]:
        """The problem as ``--json`` shows it."""
        return {
            "file": None if file is None else str(file),
            "line": self.line,
            "key": self.key,
            "message": self.message,
        }


def near(word: str, choices: Collection[str]) -> str | None:
    """The choice ``word`` most likely misspells, if one is close enough."""
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def check_agent_file(path: Path, harnesses: Collection[str] | None = None) -> list[Problem]:
    """The problems of the agent file at ``path`` (see :func:`check_agent_text`).

    Raises:
        OSError: the file cannot be read.
    """
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [Problem("", None, f"not UTF-8 text (byte {exc.start})")]
    return check_agent_text(text, harnesses)


def check_agent_text(text: str, harnesses: Collection[str] | None = None) -> list[Problem]:
    """The problems of one agent YAML document, in file order; empty when it is valid.

    ``harnesses``: the harness names the runner runs; None skips that check (nobody knows
    them yet, e.g. before a runner connected).
    """
    size = len(text.encode())
    if size > MAX_YAML_BYTES:
        return [Problem("", None, f"too large: {size} bytes (limit {MAX_YAML_BYTES})")]
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        return [
            Problem(
                "",
                mark.line + 1 if mark is not None else None,
                f"invalid YAML: {exc.problem or exc.context or exc}"
                + (f" (column {mark.column + 1})" if mark is not None else ""),
            )
        ]
    except yaml.YAMLError as exc:
        return [Problem("", None, f"invalid YAML: {exc}")]
    if not isinstance(root, yaml.MappingNode):
        kind = "empty" if root is None else _kind_word(root)
        line = None if root is None else root.start_mark.line + 1
        return [Problem("", line, f"an agent file is a mapping of keys, got {kind}")]
    problems = list(_check_section(root, AGENT, ""))
    if harnesses is not None:
        problems += _check_harness(root, harnesses)
    return sorted(problems, key=lambda p: p.line or 0)


def _check_section(node: yaml.MappingNode, schema: Schema, prefix: str) -> Iterator[Problem]:
    seen: set[str] = set()
    for key_node, value in node.value:
        line = key_node.start_mark.line + 1
        key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
        dotted = f"{prefix}{key}"
        if key == "<<":  # a YAML merge key: what it merges in is not checked here
            continue
        if key in seen:
            yield Problem(dotted, line, "given twice")
        seen.add(key)
        if key not in schema:
            guess = near(key, schema)
            hint = f" (did you mean {guess}?)" if guess else ""
            yield Problem(dotted, line, f"unknown key{hint}")
            continue
        allowed = schema[key]
        if isinstance(allowed, dict):
            if isinstance(value, yaml.MappingNode):
                yield from _check_section(value, allowed, f"{dotted}.")
                continue
            also = _SECTION_ALSO.get(dotted, ())
            if _kind(value) == "null" or _kind(value) in also:
                continue
            yield _wrong(dotted, value, ("map", *also))
        elif "any" not in allowed and _kind(value) not in (*allowed, "null"):
            yield _wrong(dotted, value, allowed)


def _check_harness(root: yaml.MappingNode, harnesses: Collection[str]) -> Iterator[Problem]:
    executor = _get(root, "executor")
    if not isinstance(executor, yaml.MappingNode):
        return
    places = [("executor.harness", _get(executor, "harness"))]
    config = _get(executor, "config")
    if isinstance(config, yaml.MappingNode):
        places.append(("executor.config.harness", _get(config, "harness")))
    for key, node in places:
        if not isinstance(node, yaml.ScalarNode) or _kind(node) != "str":
            continue
        name = str(node.value)
        if name in harnesses:
            continue
        guess = near(name, harnesses)
        hint = f" (did you mean {guess}?)" if guess else ""
        runs = ", ".join(sorted(harnesses)) or "none"
        yield Problem(
            key,
            node.start_mark.line + 1,
            f"unknown harness {name!r}{hint}; this runner runs: {runs}",
        )


def _get(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    for key_node, value in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value
    return None


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "map"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    tag = str(node.tag).rsplit(":", 1)[-1]
    return tag if tag in (*_SCALAR, "null") else "str"


def _kind_word(node: yaml.Node) -> str:
    return _KIND_WORDS[_kind(node)]


def _wrong(key: str, value: yaml.Node, allowed: tuple[str, ...]) -> Problem:
    words = [_KIND_WORDS[k] for k in allowed if k in _KIND_WORDS]
    expected = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
    return Problem(key, value.start_mark.line + 1, f"must be {expected}, got {_kind_word(value)}")
