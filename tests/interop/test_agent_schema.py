"""The strict agent-file schema (corral.agent_files) against omnigent 0.19.1's own readers.

Every key omnigent's loaders read from an agent YAML must be a key corral's schema accepts,
or a real omnigent agent file would be refused by ``corral agents validate`` and the embedded
control plane. The keys are read from omnigent's source in the venv (``ast``, nothing of it
imported here): each ``<var>.get("key")``, ``<var>["key"]`` and ``"key" in <var>`` of the
functions below, for the variable holding that section of the YAML.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from corral.agent_files import AGENT, AUTH, EXECUTOR, OS_ENV, SANDBOX, Schema

#: (file under omnigent/, function, variable) → the section of corral's schema it reads.
READERS: list[tuple[str, str, str, Schema]] = [
    ("inner/loader.py", "_parse_agent_def", "data", AGENT),
    ("inner/loader.py", "_parse_executor_spec", "data", EXECUTOR),
    ("inner/loader.py", "_parse_os_env_spec", "data", OS_ENV),
    ("inner/loader.py", "_parse_os_env_sandbox_spec", "data", SANDBOX),
    ("spec/parser.py", "parse", "raw", AGENT),
    ("spec/parser.py", "_parse_executor", "raw", EXECUTOR),
    ("spec/parser.py", "_parse_executor_auth", "raw", EXECUTOR),
    ("spec/parser.py", "_parse_executor_auth", "raw_auth", AUTH),
    ("spec/parser.py", "_parse_os_env", "raw", OS_ENV),
    ("spec/parser.py", "_parse_os_env_sandbox", "raw", SANDBOX),
    ("spec/omnigent.py", "agent_def_to_agent_spec", "raw_yaml", AGENT),
    ("spec/omnigent.py", "_translate_llm_from_def", "raw_executor", EXECUTOR),
    ("spec/omnigent.py", "_translate_executor_from_def", "raw_executor", EXECUTOR),
]


def _keys_read(tree: ast.Module, function: str, var: str) -> set[str]:
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    keys: set[str] = set()

    def const(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    def is_var(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == var

    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_var(node.func.value)
            and node.args
        ):
            key = const(node.args[0])
        elif isinstance(node, ast.Subscript) and is_var(node.value):
            key = const(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In)
            and is_var(node.comparators[0])
        ):
            key = const(node.left)
        else:
            continue
        if key is not None:
            keys.add(key)
    return keys


def test_every_key_omnigent_reads_from_an_agent_yaml_is_in_corrals_schema(
    omnigent_venv: Path,
) -> None:
    [package] = omnigent_venv.glob("lib/python3*/site-packages/omnigent")
    missing: dict[str, set[str]] = {}
    seen = 0
    for file, function, var, schema in READERS:
        tree = ast.parse((package / file).read_text())
        keys = _keys_read(tree, function, var)
        assert keys, f"{file}:{function} reads nothing from {var}: did omnigent change?"
        seen += len(keys)
        unknown = keys - set(schema)
        if unknown:
            missing[f"{file}:{function}({var})"] = unknown
    assert not missing, missing
    assert seen > 80


@pytest.mark.parametrize("section", ["executor", "os_env", "os_env.sandbox", "executor.auth"])
def test_the_nested_sections_are_the_schemas_this_test_checks(section: str) -> None:
    node: object = AGENT
    for part in section.split("."):
        assert isinstance(node, dict)
        node = node[part]
    assert node in (EXECUTOR, OS_ENV, SANDBOX, AUTH)
