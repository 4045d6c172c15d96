"""Lazy package exports: a package re-exports names that are imported on first use.

Why: an actor package's ``__init__`` re-exports its parts, and importing any submodule runs
it first, so the tools actor importing ``dispatch.messages`` loaded the whole dispatch actor
(and the gateway with it): every actor process paid for the others' imports. The pattern is
scientific-python's ``lazy_loader.attach_stub``, with the names read from the package's own
``if TYPE_CHECKING:`` block instead of a stub file, so they are written once and the type
checker sees them as ordinary imports::

    if TYPE_CHECKING:
        from ._actor import DispatchActor as DispatchActor

    __getattr__, __dir__ = lazy_exports(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def lazy_exports(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each name its ``__init__`` imports
    under ``if TYPE_CHECKING:`` (``from .sub import X as X``) is imported from ``.sub`` on
    first use."""
    where = _type_checking_imports(Path(init_file))

    def getattr_(name: str) -> Any:
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sub, package), name)
        importlib.import_module(package).__dict__[name] = value  # later lookups skip us
        return value

    def dir_() -> list[str]:
        return sorted(where)

    return getattr_, dir_


def _type_checking_imports(init_file: Path) -> dict[str, str]:
    """``{name: ".sub"}`` for every ``from .sub import name`` under ``if TYPE_CHECKING:``."""
    tree = ast.parse(init_file.read_text(), str(init_file))
    where: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
                for alias in stmt.names:
                    where[alias.asname or alias.name] = f".{stmt.module}"
    return where


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
