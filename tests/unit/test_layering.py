"""Layering of corral as ../shared/spec/STYLE.md draws it, read from the imports themselves.

Every module under ``corral/`` is parsed (``ast``, nothing is imported) and each of its
imports of another part of corral is checked against the table below: arrows only point
down. A lower floor that needs something of a higher one gets it moved down a floor, never
a new row in the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import corral

ROOT = Path(corral.__file__).parent

#: The floor: the bus, the journal, settings, the agent spec and the small shared pieces
#: every process of a host uses. It imports nothing from above.
FLOOR = frozenset(
    {
        "corral",  # the package itself: __version__
        "_bundle_files",
        "_changes",
        "_child_env",
        "_exceptions",
        "_server_answers",
        "_heap",
        "_input",
        "_jsonlines",
        "_lazy",
        "_lifeline",
        "_logfile",
        "_proctitle",
        "_tls",
        "_zygote",
        "agent_files",
        "bus",
        "clis",
        "config",
        "instance",
        "journal",
        "logs",
        "routes",
        "runners",
        "server_client",
        "server_wait",
        "spec",
    }
)
EVERYTHING = frozenset({"corral", *(p.stem for p in ROOT.iterdir())}) - {"__pycache__", "__init__"}

#: Part of corral (its first name under ``corral.``) → the parts it may import, and why.
RULES: dict[str, tuple[frozenset[str], str]] = {
    **{
        part: (FLOOR, "the floor: shared by every process, so it can lean on nothing above")
        for part in FLOOR
    },
    "harnesses": (
        FLOOR - {"journal", "runners", "server_client", "server_wait", "routes", "instance"},
        "a worker is a process of its own: it talks to the host as a bus peer, never through "
        "an actor's code, the journal or the server",
    ),
    "tools": (
        FLOOR,
        "the tools run inside the tools actor; what they share with workers (the child "
        "environment) lives on the floor",
    ),
    "server": (
        FLOOR - {"bus", "journal", "routes", "runners", "instance", "_lifeline", "_child_env"},
        "the embedded control plane is a separate program in spirit: it reaches the host "
        "only through the tunnel and HTTP, as a foreign server would (no bus, no journal)",
    ),
    "actors": (
        FLOOR | {"harnesses", "tools"},
        "actors run the harnesses and the tools: they import their protocols and libraries",
    ),
    "bench": (EVERYTHING - {"cli"}, "benchmarks drive real hosts and actors; the CLI runs them"),
    "cli": (EVERYTHING, "the CLI starts and talks to a host: it may import everything below"),
    "_launch": (
        EVERYTHING - {"__main__"},
        "the corral command: it makes the seed (corral/_zygote/_seed.py) from what the actors "
        "and workers import, then runs the CLI",
    ),
    "__main__": (frozenset({"_launch"}), "python -m corral is the corral command"),
}

#: The supervision runtime (``corral.actors`` minus the actors themselves) and what it may
#: not import, and why.
SUPERVISOR = (
    "_actor",
    "_actor_specs",
    "_child_state",
    "_children",
    "_control",
    "_control_plane",
    "_entry",
    "_process",
    "_restart",
    "_specs",
    "host",
)
SUPERVISOR_MAY_NOT = ("corral.harnesses", "corral.tools", "corral.routes")
SUPERVISOR_WHY = (
    "supervision is generic: a supervisor that knows an actor's messages or modules breaks "
    "whenever that actor changes (the CLI composes what a host shows of them)"
)


def _module_name(path: Path) -> str:
    parts = ["corral", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The corral modules ``path`` imports (``from .. import logs`` is ``corral.logs``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "corral")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "corral":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                module = ROOT.joinpath(*sub.split(".")[1:])
                is_module = module.with_suffix(".py").exists() or module.is_dir()
                found.add(sub if is_module else target)
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "corral"


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_part_of_corral_has_a_rule() -> None:
    assert {_part(_module_name(p)) for p in MODULES} <= RULES.keys()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_point_down(path: Path) -> None:
    name = _module_name(path)
    allowed, why = RULES[_part(name)]
    wrong = sorted(m for m in _imports(path) if _part(m) != _part(name) and _part(m) not in allowed)
    assert not wrong, f"{name} imports {wrong}; {_part(name)} may import {sorted(allowed)}: {why}"


@pytest.mark.parametrize("module", SUPERVISOR)
def test_the_supervisor_knows_no_actor(module: str) -> None:
    path = ROOT / "actors" / f"{module}.py"
    actors = {p.stem for p in (ROOT / "actors").iterdir() if not p.name.startswith("_")}
    wrong = sorted(
        m
        for m in _imports(path)
        if m.startswith(SUPERVISOR_MAY_NOT)
        or (m.startswith("corral.actors.") and m.split(".")[2] in actors - set(SUPERVISOR))
    )
    assert not wrong, f"corral.actors.{module} imports {wrong}: {SUPERVISOR_WHY}"
