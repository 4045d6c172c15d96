"""The agent spec: typed fields named in errors, unknown fields kept, bundles refused safely."""

from __future__ import annotations

import gzip
import io
import tarfile
from typing import Any

import msgspec
import pytest

from corral._exceptions import CorralError, SpecError
from corral.spec import (
    AgentSpec,
    AuthSpec,
    ExecutorConfig,
    ExecutorSpec,
    OsEnvSpec,
    SandboxSpec,
    load_bundle,
    load_spec_yaml,
    make_bundle,
    parse_spec,
    spec_to_dict,
)

# The bundle member of PROTOCOL_FACTS §iii.3, verbatim.
CAPTURED_YAML = """\
executor:
  auth:
    api_key: mock-key
    base_url: http://127.0.0.1:18933/v1
    type: api_key
  harness: openai-agents
  model: fake-tool-xb0f7b6
name: proto-tool-021697
os_env:
  cwd: .
  sandbox:
    type: none
  type: caller_process
prompt: terse
"""

# The example of docs/scripted-harness.md.
SCRIPTED_YAML = """\
name: approval-demo
executor:
  harness: scripted
  script:
    turns:
      - - {text: "Let me check. "}
        - {tool: sys_os_shell, arguments: {command: "echo hi"}}
        - {elicit: {message: "May I deploy?", requestedSchema: {properties: {ok: {type: boolean}}}}}
        - {text: "Deployed.", on_decline: "Not deployed."}
"""


def tar_gz(*members: tarfile.TarInfo | tuple[str, bytes]) -> bytes:
    """A tar.gz of ``(name, content)`` files and raw TarInfo members (links, devices)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    return gzip.compress(buffer.getvalue())


# -- parsing -----------------------------------------------------------------------------------


def test_the_captured_yaml_parses_into_typed_fields() -> None:
    spec = load_spec_yaml(CAPTURED_YAML)
    assert spec == AgentSpec(
        name="proto-tool-021697",
        executor=ExecutorSpec(
            harness="openai-agents",
            model="fake-tool-xb0f7b6",
            auth=AuthSpec(type="api_key", api_key="mock-key", base_url="http://127.0.0.1:18933/v1"),
        ),
        os_env=OsEnvSpec(type="caller_process", cwd=".", sandbox=SandboxSpec(type="none")),
        prompt="terse",
    )
    assert (spec.harness, spec.model, spec.system_prompt) == (
        "openai-agents",
        "fake-tool-xb0f7b6",
        "terse",
    )


def test_a_scripted_spec_keeps_its_script_as_written() -> None:
    spec = load_spec_yaml(SCRIPTED_YAML)
    assert spec.harness == "scripted"
    assert spec.executor.script is not None
    steps = spec.executor.script["turns"][0]
    assert steps[1] == {"tool": "sys_os_shell", "arguments": {"command": "echo hi"}}
    assert steps[3] == {"text": "Deployed.", "on_decline": "Not deployed."}


def test_config_harness_is_accepted_and_an_explicit_harness_wins() -> None:
    spec = parse_spec({"executor": {"type": "omnigent", "config": {"harness": "claude-native"}}})
    assert spec.harness == "claude-native"
    assert spec.executor.config == ExecutorConfig(harness="claude-native")
    both = parse_spec({"executor": {"harness": "scripted", "config": {"harness": "codex"}}})
    assert both.harness == "scripted"
    assert parse_spec({}).harness is None


def test_every_field_of_the_brief_is_typed() -> None:
    spec = parse_spec(
        {
            "name": "full",
            "instructions": "be brief",
            "executor": {"type": "omnigent", "model": "m", "auth": {"type": "api_key"}},
            "os_env": {"type": "caller_process", "cwd": "work", "sandbox": "none"},
            "terminals": [{"name": "tui"}],
            "tools": {"agents": ["researcher"]},
            "sub_agents": [{"name": "researcher"}],
            "spawn": True,
            "agent_session_sharing": "non-public",
        }
    )
    assert spec.system_prompt == "be brief"
    assert isinstance(spec.os_env, OsEnvSpec) and spec.os_env.sandbox == "none"
    assert spec.terminals == [{"name": "tui"}]
    assert spec.tools == {"agents": ["researcher"]}
    assert spec.sub_agents == [{"name": "researcher"}]
    assert spec.spawn is True and spec.agent_session_sharing == "non-public"
    assert parse_spec({"os_env": "inherit"}).os_env == "inherit"
    assert parse_spec({"executor": None}).executor == ExecutorSpec()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"executor": {"model": 5}}, "Expected str, got int - at $.executor.model"),
        ({"name": 3}, "Expected str, got int - at $.name"),
        ({"name": ""}, "Expected str of length >= 1 - at $.name"),
        ({"executor": {"harness": ["a"]}}, "Expected str, got array - at $.executor.harness"),
        (
            {"executor": {"config": {"harness": 1}}},
            "Expected str, got int - at $.executor.config.harness",
        ),
        ({"executor": {"auth": "key"}}, "Expected object, got str - at $.executor.auth"),
        (
            {"executor": {"auth": {"base_url": 1}}},
            "Expected str, got int - at $.executor.auth.base_url",
        ),
        ({"executor": {"script": []}}, "Expected object, got array - at $.executor.script"),
        ({"executor": "scripted"}, "Expected object, got str - at $.executor"),
        ({"os_env": {"cwd": 1}}, "Expected str, got int - at $.os_env.cwd"),
        (
            {"os_env": {"sandbox": {"type": True}}},
            "Expected str, got bool - at $.os_env.sandbox.type",
        ),
        ({"os_env": 7}, "Expected str | object, got int - at $.os_env"),
        ({"tools": "all"}, "Expected object | array, got str - at $.tools"),
        ({"terminals": 1}, "Expected object | array, got int - at $.terminals"),
        ({"sub_agents": True}, "Expected object | array, got bool - at $.sub_agents"),
        ({"spawn": "yes"}, "Expected bool, got str - at $.spawn"),
        ({"prompt": {"text": "x"}}, "Expected str, got object - at $.prompt"),
        (
            {"agent_session_sharing": "everyone"},
            "Invalid enum value 'everyone' - at $.agent_session_sharing",
        ),
    ],
)
def test_wrong_types_are_errors_naming_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert str(info.value) == f"invalid agent spec: {message}"
    assert info.value.path == message.rsplit(" - at ", 1)[1]
    assert isinstance(info.value, CorralError) and isinstance(info.value, ValueError)


def test_a_spec_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^invalid agent spec: Expected object, got array$"):
        parse_spec([1, 2])
    with pytest.raises(SpecError, match=r"^invalid agent spec: expected a mapping at the top, got"):
        load_spec_yaml("- a\n- b\n")
    with pytest.raises(SpecError, match=r"got empty$"):
        load_spec_yaml("")


def test_unknown_fields_are_tolerated_and_survive_the_round_trip() -> None:
    text = """\
name: foreign
description: written for another runner
spec_version: 1
model: top-level-model
executor:
  harness: openai
  model: m
  max_steps: 3
  headers: {X-Team: a}
  auth: {type: api_key, api_key: $KEY, region: eu}
  config: {harness: openai, profile: dev}
os_env:
  type: caller_process
  sandbox: {type: bwrap, network: false}
  env: {A: "1"}
llm: {model: openai/gpt-5.4}
"""
    spec = load_spec_yaml(text)
    assert spec.extra == {
        "description": "written for another runner",
        "model": "top-level-model",
        "llm": {"model": "openai/gpt-5.4"},
    }
    assert spec.spec_version == 1  # omnigent's directory format, a known field
    assert spec.executor.extra == {"max_steps": 3, "headers": {"X-Team": "a"}}
    assert spec.executor.auth is not None and spec.executor.auth.extra == {"region": "eu"}
    assert spec.executor.config is not None and spec.executor.config.extra == {"profile": "dev"}
    assert isinstance(spec.os_env, OsEnvSpec) and spec.os_env.extra == {"env": {"A": "1"}}
    assert isinstance(spec.os_env.sandbox, SandboxSpec)
    assert spec.os_env.sandbox.extra == {"network": False}

    data = spec_to_dict(spec)
    assert data["executor"]["max_steps"] == 3
    assert data["executor"]["auth"] == {"type": "api_key", "api_key": "$KEY", "region": "eu"}
    assert data["os_env"]["sandbox"] == {"type": "bwrap", "network": False}
    assert data["llm"] == {"model": "openai/gpt-5.4"}
    assert "__corral_extra__" not in msgspec.json.encode(data).decode()
    assert parse_spec(data) == spec
    # Over the bus and back (msgpack), still the same spec.
    assert parse_spec(msgspec.msgpack.decode(msgspec.msgpack.encode(data))) == spec


def test_round_trip_of_the_captured_and_scripted_specs_is_exact() -> None:
    for text in (CAPTURED_YAML, SCRIPTED_YAML):
        spec = load_spec_yaml(text)
        assert parse_spec(spec_to_dict(spec)) == spec
    import yaml

    assert spec_to_dict(load_spec_yaml(CAPTURED_YAML)) == yaml.safe_load(CAPTURED_YAML)


def test_spec_to_dict_omits_defaults_and_turns_yaml_dates_into_strings() -> None:
    assert spec_to_dict(AgentSpec()) == {}
    spec = load_spec_yaml("name: dated\nreleased: 2026-11-29\n")
    assert spec_to_dict(spec) == {"name": "dated", "released": "2026-11-29"}
    msgspec.json.encode(spec_to_dict(spec))


def test_modified_specs_keep_their_unknown_fields() -> None:
    spec = load_spec_yaml(CAPTURED_YAML + "executor_extra_top: 1\n")
    overridden = msgspec.structs.replace(
        spec, executor=msgspec.structs.replace(spec.executor, model="override")
    )
    data = spec_to_dict(overridden)
    assert data["executor"]["model"] == "override"
    assert data["executor_extra_top"] == 1


def test_the_api_key_is_masked_in_repr() -> None:
    spec = load_spec_yaml(CAPTURED_YAML)
    assert "mock-key" not in repr(spec)
    assert "mock-key" not in repr(spec.executor.auth)
    assert spec.executor.auth is not None and spec.executor.auth.api_key == "mock-key"


def test_yaml_syntax_errors_say_where() -> None:
    with pytest.raises(SpecError, match=r"^invalid agent YAML: .* at line 2, column \d+$"):
        load_spec_yaml("name: x\nexecutor: {harness: x]\nprompt: y\n")


def test_oversized_yaml_and_alias_bombs_are_refused() -> None:
    with pytest.raises(SpecError, match=r"^agent YAML is too large: \d+ bytes \(limit \d+\)$"):
        load_spec_yaml("name: x\n" + "#" * (1024 * 1024))
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefgh":
        previous = chr(ord(level) - 1)
        bomb.append(f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 10) + "]")
    bomb.append("tools: {all: *h}")
    with pytest.raises(SpecError, match=r"^agent spec is too large: more than \d+ values"):
        load_spec_yaml("\n".join(bomb))


# -- bundles -----------------------------------------------------------------------------------


def test_a_bundle_of_the_captured_agent_parses() -> None:
    bundle = make_bundle(CAPTURED_YAML, filename="proto-tool-021697.yaml")
    assert load_bundle(bundle) == load_spec_yaml(CAPTURED_YAML)
    assert make_bundle(CAPTURED_YAML) == make_bundle(CAPTURED_YAML)  # reproducible


def test_the_agent_yaml_is_found_among_other_files() -> None:
    bundle = tar_gz(
        ("AGENTS.md", b"# instructions"),
        ("skills/deep-search/SKILL.md", b"---\nname: deep-search\n---\n"),
        ("agents/researcher/config.yaml", b"name: researcher\n"),
        ("./config.yaml", CAPTURED_YAML.encode()),
    )
    assert load_bundle(bundle).name == "proto-tool-021697"
    nested = tar_gz(("proto/", b""), ("proto/proto.yml", b"name: nested\n"))
    assert load_bundle(nested).name == "nested"


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("../evil.yaml", b"name: x\n")], r"escapes the bundle \('\.\.' in its path\)"),
        ([("a/../../evil.yaml", b"name: x\n")], r"escapes the bundle"),
        ([("/etc/agent.yaml", b"name: x\n")], r"has an absolute path"),
        ([("a\\..\\b.yaml", b"name: x\n")], r"has an invalid path"),
        ([], r"holds no agent YAML"),
        ([("README.md", b"hi")], r"holds no agent YAML"),
        ([("a.yaml", b"name: a\n"), ("b.yaml", b"name: b\n")], r"several agent YAML files"),
        ([("agent.yaml", b"\xff\xfe")], r"is not UTF-8 text"),
        ([("agent.yaml", b"name: [1\n")], r"^invalid agent YAML: "),
        ([("agent.yaml", b"executor: {model: 5}\n")], r"at \$\.executor\.model$"),
    ],
)
def test_bad_bundles_are_refused_clearly(members: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_bundle(tar_gz(*members))


def test_link_and_device_members_are_refused() -> None:
    link = tarfile.TarInfo("agent.yaml")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(SpecError, match=r"^agent bundle member 'agent.yaml' is a symlink"):
        load_bundle(tar_gz(link))
    hard = tarfile.TarInfo("other.yaml")
    hard.type, hard.linkname = tarfile.LNKTYPE, "agent.yaml"
    with pytest.raises(SpecError, match=r"is a hard link; links are not allowed$"):
        load_bundle(tar_gz(("agent.yaml", b"name: x\n"), hard))
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(SpecError, match=r"is not a regular file or directory$"):
        load_bundle(tar_gz(("agent.yaml", b"name: x\n"), fifo))


def test_oversized_bundles_are_refused() -> None:
    bundle = make_bundle(CAPTURED_YAML)
    with pytest.raises(SpecError, match=r"^agent bundle is too large: \d+ bytes \(limit 100\)$"):
        load_bundle(bundle, max_bytes=100)
    # A gzip bomb: small compressed, large unpacked; stops at the limit, not at the end.
    bomb = tar_gz(("agent.yaml", b"name: x\n"), ("zeros.bin", b"\0" * 5_000_000))
    assert len(bomb) < 20_000
    with pytest.raises(SpecError, match=r"^agent bundle unpacks to more than 1000000 bytes$"):
        load_bundle(bomb, max_unpacked=1_000_000)
    big_yaml = make_bundle("name: x\n" + "#" * (2 * 1024 * 1024))
    with pytest.raises(SpecError, match=r"^agent YAML 'agent.yaml' is too large"):
        load_bundle(big_yaml)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"name: x\n", r"^agent bundle is not gzip data \(expected a tar\.gz\)$"),
        (b"", r"^agent bundle is not gzip data"),
        (gzip.compress(b"not a tar archive at all" * 40), r"^agent bundle is not a .*tar archive"),
        (make_bundle(CAPTURED_YAML)[:40], r"^agent bundle is (truncated|not valid) gzip data"),
        (b"\x1f\x8b" + b"\x00" * 30, r"^agent bundle is not valid gzip data"),
    ],
    # Named, not by their bytes: a gzip header holds the time it was made, and pytest-xdist's
    # workers must collect the same test ids.
    ids=["yaml", "empty", "gzip-not-tar", "truncated-gzip", "bad-gzip"],
)
def test_bundles_that_are_not_tar_gz_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_bundle(data)


def test_a_bundle_must_be_bytes() -> None:
    with pytest.raises(SpecError, match=r"^agent bundle must be bytes, got str$"):
        load_bundle("name: x")  # type: ignore[arg-type]


def test_s10_a_directory_agent_s_children_are_among_its_sub_agents() -> None:
    """The tools read a sub-agent's harness and provider from the parent's ``sub_agents``
    (S-10): a directory agent's children (``agents/<name>/config.yaml``) are put there, each
    as ``{name, executor}``, unless the spec lists that name itself; a child whose YAML does
    not parse is left out; a child's own spec gets its own children."""
    coder = b"name: coder\nexecutor:\n  harness: codex\n  auth: {type: databricks}\n"
    bundle = tar_gz(
        ("config.yaml", b"name: lead\nsub_agents:\n  - {name: listed, executor: {harness: pi}}\n"),
        ("agents/coder/config.yaml", coder),
        ("agents/listed/config.yaml", b"name: listed\nexecutor: {harness: openai}\n"),
        ("agents/broken/config.yaml", b"name: [1\n"),
        ("agents/coder/agents/helper/config.yaml", b"name: helper\nexecutor: {harness: pi}\n"),
    )
    spec = load_bundle(bundle)
    assert spec.sub_agents == [
        {"name": "listed", "executor": {"harness": "pi"}},
        {"name": "coder", "executor": {"harness": "codex", "auth": {"type": "databricks"}}},
    ]
    child = load_bundle(bundle, sub_agent="coder")
    assert child.sub_agents == [{"name": "helper", "executor": {"harness": "pi"}}]
    mapping = tar_gz(
        ("config.yaml", b"name: lead\nsub_agents: {listed: {executor: {harness: pi}}}\n"),
        ("agents/coder/config.yaml", coder),
    )
    assert load_bundle(mapping).sub_agents == {
        "listed": {"executor": {"harness": "pi"}},
        "coder": {
            "name": "coder",
            "executor": {"harness": "codex", "auth": {"type": "databricks"}},
        },
    }
