"""The house's import rules, checked on the modules as Python loads them (the contracts in
pyproject.toml are checked by ``lint-imports`` in ``make lint``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

SERVER = ("app.services", "app.storage", "app.api", "app.web", "app.cli")
FRAMEWORKS = ("sqlalchemy", "alembic", "fastapi", "starlette", "jinja2", "uvicorn")

LOADED = """
import importlib, json, pkgutil, sys
import {package}
for m in pkgutil.walk_packages({package}.__path__, "{package}."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(package: str) -> list[str]:
    """Every module loaded by importing each module of ``package``, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED.format(package=package)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def server_side(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] in FRAMEWORKS or any(m == s or m.startswith(s + ".") for s in SERVER)
    ]


def test_the_worker_loads_nothing_of_the_server() -> None:
    modules = loaded_by("app.worker")
    assert "app.worker.loop" in modules and "app.client.runner" in modules
    assert server_side(modules) == []


def test_the_client_protocol_and_targets_load_nothing_of_the_server() -> None:
    for package in ("app.client", "app.protocol", "app.targets"):
        assert server_side(loaded_by(package)) == [], package


def test_the_check_sees_a_server_module() -> None:
    """The filter itself: importing the services package is caught."""
    modules = loaded_by("app.services")
    assert "sqlalchemy" in modules
    assert "app.services.runs" in server_side(modules)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm), local
    imports included: a cycle dodged with an import inside a function is still a cycle."""
    imports = graph.find_modules_directly_imported_by
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(imports(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for m in modules:
        if m not in index:
            visit(m)
    return groups


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert import_cycles(grimp.build_graph("app")) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cyc import b\n")
    (pkg / "b.py").write_text("from cyc import a\n")
    (pkg / "c.py").write_text("from cyc import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles(grimp.build_graph("cyc")) == [["cyc.a", "cyc.b"]]
