"""omnigent agent YAMLs read unchanged: the flat and the directory format, and their policies.

The files are written as omnigent 0.19.1 reads them (PROTOCOL_0_19.md "How to run the real
server locally"; the directory layout is what the real server bundles, observed by fetching
``GET /v1/sessions/{id}/agent/contents`` for an agent registered with ``--agent <dir>``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from corral.config import PolicyRule
from corral.server._policy import (
    OS_TOOLS,
    TOOL_CALL,
    Decision,
    UnknownPolicy,
    combine,
    decide,
    policies_of,
)
from corral.spec import (
    SpecError,
    agent_policies,
    load_agent_dir,
    load_bundle,
    load_spec_yaml,
    make_bundle,
    make_bundle_files,
    parse_spec,
    spec_to_dict,
)
from corral.tools.registry import OS_TOOL_NAMES

ASK_ON_OS = "omnigent.policies.builtins.safety.ask_on_os_tools"
FLAT = f"""\
name: tool
executor:
  harness: openai-agents
  model: tool
  auth: {{type: api_key, api_key: mock-key, base_url: http://127.0.0.1:9/v1}}
prompt: terse
os_env: {{type: caller_process, cwd: ., sandbox: {{type: none}}}}
policies:
  ask_os: {{type: function, function: {{path: {ASK_ON_OS}}}}}
"""
PARENT = f"""\
spec_version: 1
name: parent
executor:
  type: omnigent
  model: plain
  auth: {{type: api_key, api_key: mock-key, base_url: http://127.0.0.1:9/v1}}
  config: {{harness: openai-agents}}
prompt: you delegate
tools:
  agents: [child]
guardrails:
  policies:
    ask_os: {{type: function, function: {ASK_ON_OS}}}
"""
CHILD = """\
spec_version: 1
name: child
executor:
  type: omnigent
  model: echo
  auth: {type: api_key, api_key: mock-key, base_url: http://127.0.0.1:9/v1}
  config: {harness: openai-agents}
"""


def write_parent(root: Path) -> Path:
    (root / "agents" / "child").mkdir(parents=True)
    (root / "config.yaml").write_text(PARENT)
    (root / "agents" / "child" / "config.yaml").write_text(CHILD)
    (root / "agents" / "child" / "AGENTS.md").write_text("You are the child.\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return root


def test_flat_format() -> None:
    spec = load_spec_yaml(FLAT)
    assert (spec.name, spec.harness, spec.model, spec.system_prompt) == (
        "tool",
        "openai-agents",
        "tool",
        "terse",
    )
    assert spec.executor is not None and spec.executor.auth is not None
    assert spec.executor.auth.base_url == "http://127.0.0.1:9/v1"
    assert spec.os_env is not None and not isinstance(spec.os_env, str)
    assert (spec.os_env.type, spec.os_env.cwd) == ("caller_process", ".")
    [policy] = agent_policies(spec)
    assert (policy.name, policy.path, policy.where) == ("ask_os", ASK_ON_OS, "$.policies.ask_os")
    # The policies travel with the spec to the harness, unchanged.
    assert parse_spec(spec_to_dict(spec)) == spec
    assert spec_to_dict(spec)["policies"] == {
        "ask_os": {"type": "function", "function": {"path": ASK_ON_OS}}
    }


def test_directory_format(tmp_path: Path) -> None:
    tree = load_agent_dir(write_parent(tmp_path / "parent"))
    spec = tree.spec
    assert (spec.spec_version, spec.name, spec.harness, spec.model) == (
        1,
        "parent",
        "openai-agents",
        "plain",
    )
    assert spec.executor is not None and spec.executor.type == "omnigent"
    assert spec.tools == {"agents": ["child"]}
    assert [(p.name, p.where) for p in agent_policies(spec)] == [
        ("ask_os", "$.guardrails.policies.ask_os")
    ]
    assert list(tree.children) == ["child"]
    child = tree.children["child"]
    assert (child.harness, child.model) == ("openai-agents", "echo")
    assert child.system_prompt == "You are the child.\n"  # AGENTS.md, as omnigent reads it
    assert sorted(tree.files) == [
        "agents/child/AGENTS.md",
        "agents/child/config.yaml",
        "config.yaml",
    ]
    assert tree.config_text == PARENT
    # Bundled whole, as the real server bundles a directory; reproducible byte for byte.
    bundle = make_bundle_files(tree.files)
    assert bundle == make_bundle_files(dict(reversed(tree.files.items())))
    # The bundle's spec is the directory's, with its child's executor among its sub-agents
    # (where the tools read a sub-agent's harness, S-10).
    bundled = load_bundle(bundle)
    assert msgspec.structs.replace(bundled, sub_agents=None) == spec
    assert isinstance(bundled.sub_agents, list)
    assert [(e["name"], e["executor"]["harness"]) for e in bundled.sub_agents] == [
        ("child", "openai-agents")
    ]


def test_directory_errors_name_the_file(tmp_path: Path) -> None:
    root = write_parent(tmp_path / "parent")
    (root / "agents" / "child" / "config.yaml").write_text("executor:\n  model: 5\n")
    with pytest.raises(SpecError, match=r"agents/child/config\.yaml: invalid agent spec: .*model"):
        load_agent_dir(root)
    with pytest.raises(SpecError, match=r"has no config\.yaml"):
        load_agent_dir(tmp_path)


def test_bundle_prompt_from_agents_md() -> None:
    bundle = make_bundle_files(
        {"config.yaml": CHILD.encode(), "AGENTS.md": b"Be the child.", "notes/x.yaml": b"a: 1"}
    )
    assert load_bundle(bundle).system_prompt == "Be the child."
    # A prompt in config.yaml wins, as in omnigent.
    with_prompt = CHILD + "prompt: inline\n"
    bundle = make_bundle_files({"config.yaml": with_prompt.encode(), "AGENTS.md": b"ignored"})
    assert load_bundle(bundle).system_prompt == "inline"
    # A flat bundle (the YAML file as it is) is unchanged.
    assert load_bundle(make_bundle(FLAT, filename="tool.yaml")).name == "tool"


@pytest.mark.parametrize(
    ("entry", "path", "arguments"),
    [
        ({"type": "function", "function": "a.b.c"}, "a.b.c", None),
        (
            {"type": "function", "function": {"path": "a.b.c", "arguments": {"n": 1}}},
            "a.b.c",
            {"n": 1},
        ),
        ({"type": "function", "handler": "a.b.c", "factory_params": {"n": 2}}, "a.b.c", {"n": 2}),
        ({"callable": "a.b.c"}, "a.b.c", None),  # the flat loader's default type and alias
    ],
)
def test_policy_shapes(entry: dict, path: str, arguments: dict | None) -> None:
    [ref] = agent_policies(parse_spec({"policies": {"p": entry}}))
    assert (ref.name, ref.path, ref.arguments) == ("p", path, arguments)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "prompt"}, r"^invalid agent spec: policy 'p': type must be 'function', got 'pro"),
        ({"type": "function"}, r"^invalid agent spec: policy 'p': needs `function:`"),
        ({"type": "label"}, r"^invalid agent spec: policy 'p': type must be 'function', got 'lab"),
        ("ask", r"^invalid agent spec: policy 'p': must be a mapping, got str$"),
        (
            {"type": "function", "function": {"path": "x", "arguments": {}}, "factory_params": {}},
            r"factory arguments in function\.arguments or factory_params$",
        ),
    ],
)  # fmt: skip
def test_bad_policies(entry: object, message: str) -> None:
    spec = parse_spec({"guardrails": {"policies": {"p": entry}}})
    with pytest.raises(SpecError, match=message) as raised:
        agent_policies(spec)
    assert raised.value.path == "$.guardrails.policies.p"
    with pytest.raises(SpecError, match=r"^invalid agent spec: guardrails\.policies must be a"):
        agent_policies(parse_spec({"guardrails": {"policies": ["p"]}}))
    with pytest.raises(SpecError, match=r"at \$\.policies$"):
        parse_spec({"policies": ["p"]})


# --- what the control plane makes of them -------------------------------------------------


def test_ask_on_os_tools_is_omnigents_builtin() -> None:
    """Read from ``omnigent/policies/builtins/safety.py``: ASK on a tool-call event for the
    OS tools (and other harnesses' native names, which corral never sees), with the reason
    ``Agent wants to call <tool>(<preview>). Approve?``; the preview is the command of a
    shell, the path of a file tool; every other event is allowed."""
    [policy] = policies_of(load_spec_yaml(FLAT))
    assert OS_TOOLS == OS_TOOL_NAMES  # every OS tool corral has is gated
    shell = policy.check(TOOL_CALL, "sys_os_shell", {"command": "echo hi"})
    assert shell == Decision(
        action="ask", reason="Agent wants to call sys_os_shell('echo hi'). Approve?"
    )
    read = policy.check(TOOL_CALL, "sys_os_read", {"path": "a.txt"})
    assert read is not None and read.reason == "Agent wants to call sys_os_read('a.txt'). Approve?"
    assert policy.check(TOOL_CALL, "sys_os_write", "not an object") is not None
    assert policy.check(TOOL_CALL, "web_fetch", {"url": "x"}) is None
    assert policy.check("PHASE_TOOL_RESULT", "sys_os_shell", {}) is None
    assert policy.check("PHASE_LLM_REQUEST", None, None) is None


def test_unknown_policy_functions_are_refused() -> None:
    spec = parse_spec({"policies": {"audit": {"type": "function", "function": "myorg.audit"}}})
    with pytest.raises(
        UnknownPolicy, match=r"^policy 'audit' calls 'myorg\.audit', which"
    ) as raised:
        policies_of(spec)
    assert raised.value.path == "$.policies.audit"
    with_args = {"type": "function", "function": {"path": ASK_ON_OS, "arguments": {"n": 1}}}
    with pytest.raises(UnknownPolicy, match=r"^policy 'p': .* takes no arguments$"):
        policies_of(parse_spec({"policies": {"p": with_args}}))


def test_server_rules_and_agent_policies_combine() -> None:
    agent = policies_of(load_spec_yaml(FLAT))
    args = {"command": "ls"}

    def verdict(rules: list[PolicyRule], tool: str) -> Decision:
        return combine(decide(rules, TOOL_CALL, tool), agent, TOOL_CALL, tool, args)

    asked = verdict([], "sys_os_shell")
    assert (asked.action, asked.policy, asked.prompt) == (
        "ask",
        "ask_os",
        "ask_os: Agent wants to call sys_os_shell('ls'). Approve?",
    )
    assert verdict([], "web_fetch") == Decision(action="allow")
    # A server rule that allows does not lift the agent's ask; one that denies wins.
    allow_all = [PolicyRule(tool="*", action="allow")]
    assert verdict(allow_all, "sys_os_shell").action == "ask"
    deny = [PolicyRule(tool="sys_os_*", action="deny", message="no")]
    assert verdict(deny, "sys_os_shell") == Decision(action="deny", reason="no", rule=0)
    # Of two asks the server rule's reason stands (it comes first).
    ask = [PolicyRule(tool="sys_os_*", action="ask", message="server asks")]
    assert verdict(ask, "sys_os_shell") == Decision(action="ask", reason="server asks", rule=0)
