"""The import rules of docs/ARCHITECTURE.md, checked on every module (by parsing, not
importing): a rule the code breaks fails here, naming the module and the import."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOT_PART = "(root)"
"""The modules at the repository root (``__init__.py``: ``verimail`` itself)."""

#: Our top-level parts, and the parts of ours each may import (itself, and the package root
#: with its version strings and folder, always allowed).
MAY_IMPORT: dict[str, set[str]] = {
    # The package root (its version strings) and the settings, which every part reads.
    ROOT_PART: set(),
    "config": set(),
    "schemas": set(),
    "testbed": set(),
    # Three plain libraries side by side on the contract: none imports another.
    "engine": {"config", "schemas"},
    "files": {"config", "schemas"},
    "store": {"config", "schemas"},
    # The Prefect tasks compose the engine and the files; the job service, which holds no
    # Prefect, composes the engine, the files and the store; the flows compose both.
    "tasks": {"config", "schemas", "engine", "files"},
    "jobs": {"config", "schemas", "engine", "files", "store"},
    "flows": {"config", "schemas", "engine", "files", "tasks", "store", "jobs"},
    "runners": {"config", "schemas", "engine", "files", "store", "jobs", "flows"},
    "api": {"config", "schemas", "engine", "files", "store", "jobs", "flows", "runners"},
    "cli": {
        *("config", "schemas", "engine", "files", "store", "jobs", "runners"),
        *("api", "testbed"),
    },
}

#: Libraries that mark a layer: the engine and the file handling are plain libraries (no
#: orchestration, HTTP framework, database or terminal), the contract models import no
#: framework, and only ``cli/`` (and the self-contained testbed's own command) draws on a
#: terminal.
PLAIN_LIBRARY = {
    "prefect",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "uvicorn",
    "jinja2",
    "typer",
    "rich",
}
FORBIDDEN_LIBRARIES: dict[str, set[str]] = {
    ROOT_PART: PLAIN_LIBRARY,
    "config": PLAIN_LIBRARY,
    "schemas": {"prefect", "fastapi", "starlette", "sqlalchemy", "typer", "rich", "polars"},
    "engine": PLAIN_LIBRARY,
    "files": PLAIN_LIBRARY,
    "tasks": {"fastapi", "starlette", "sqlalchemy", "uvicorn", "jinja2", "typer", "rich"},
    "store": {"prefect", "fastapi", "starlette", "typer", "rich"},
    "jobs": {"prefect", "fastapi", "starlette", "uvicorn", "jinja2", "typer", "rich"},
    "flows": {"typer", "rich"},
    "runners": {"typer", "rich", "fastapi", "starlette", "jinja2"},
    "api": {"typer", "rich"},
    "testbed": {"prefect", "fastapi", "sqlalchemy"},
}

#: Known breaches, each with its reason (none today: the re-plan moved them to their rooms).
EXCEPTIONS: dict[str, set[str]] = {}


def _is_part(name: str) -> bool:
    """Whether ``verimail.<name>`` is a part of ours (a folder or a module at the root)."""
    return (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file()


def _imports(path: Path) -> set[str]:
    """Top-level names imported by ``path``: ours as the part's name (``from verimail import
    flows`` too), the package root's own names as ``(root)``, others as the library."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "verimail":
                names = [f"verimail.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        for name in names:
            if name == "verimail":
                found.add(ROOT_PART)
            elif name.startswith("verimail."):
                part = name.split(".")[1]
                found.add(part if _is_part(part) else ROOT_PART)
            else:
                found.add(name.split(".")[0])
    return found


def _modules() -> list[tuple[str, Path]]:
    """Every module of ours but the suite's and the bench's, with its part (the files at
    the root as ``(root)``)."""
    return [(ROOT_PART, path) for path in sorted(ROOT.glob("*.py"))] + [
        (part, path)
        for part in MAY_IMPORT
        if part != ROOT_PART
        for path in sorted((ROOT / part).rglob("*.py"))
        if "migrations" not in path.parts
    ]


@pytest.mark.parametrize("part,path", _modules(), ids=lambda v: str(v))
def test_module_keeps_to_its_layer(part: str, path: Path) -> None:
    relative = path.relative_to(ROOT).as_posix()
    ours = set(MAY_IMPORT) | {"cli", "bench", "tests"}
    imported = _imports(path) - EXCEPTIONS.get(relative, set())
    allowed = MAY_IMPORT[part] | {part, ROOT_PART}
    wrong_parts = {name for name in imported & ours if name not in allowed}
    assert not wrong_parts, f"{relative} imports {sorted(wrong_parts)} of ours"
    wrong_libraries = imported & FORBIDDEN_LIBRARIES.get(part, set())
    assert not wrong_libraries, f"{relative} imports {sorted(wrong_libraries)}"


def test_nothing_imports_the_api_or_the_command_line() -> None:
    for part, path in _modules():
        imported = _imports(path)
        where = path.relative_to(ROOT).as_posix()
        if part != "cli":
            assert "cli" not in imported, where
            if part != "api":
                assert "api" not in imported, where


def test_the_rules_see_every_part() -> None:
    """A new top-level folder with code gets a rule here (and a row in ARCHITECTURE.md)."""
    with_code = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.py"))
    }
    assert with_code <= set(MAY_IMPORT) | {"tests", "bench"}, with_code - set(MAY_IMPORT)


LONG_FILE_LINES = 500


def test_a_long_module_says_why_it_is_long() -> None:
    """A module over ~500 lines carries a one-line reason at its top ("Why one long file:"),
    so that length is a decision someone made, not drift."""
    unexplained = []
    for _part, path in _modules():
        text = path.read_text()
        if text.count("\n") > LONG_FILE_LINES:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if "Why one long file:" not in docstring:
                unexplained.append(f"{path.relative_to(ROOT).as_posix()} ({text.count(chr(10))})")
    assert not unexplained, unexplained


MOST_LINES = 600


def test_no_module_over_six_hundred_lines() -> None:
    """Past 600 lines a reason at the top is not enough: such a module mixes jobs and is
    split by responsibility (issue 32). Migrations are history, not code to read."""
    too_long = [
        f"{path.relative_to(ROOT).as_posix()} ({path.read_text().count(chr(10))})"
        for _part, path in _modules()
        if path.read_text().count("\n") > MOST_LINES
    ]
    assert not too_long, too_long


ENGINE = ROOT / "engine"
ENGINE_SUBMODULES = {p.stem for p in ENGINE.glob("*.py")} | {
    p.name for p in ENGINE.iterdir() if (p / "__init__.py").exists()
}


def _engine_submodules_imported(path: Path) -> list[str]:
    """The submodules of ``verimail.engine`` that ``path`` imports by name."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("verimail.engine.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("verimail.engine."):
                found.append(node.module)
            elif node.module == "verimail.engine":
                found += [
                    f"verimail.engine.{a.name}" for a in node.names if a.name in ENGINE_SUBMODULES
                ]
    return found


def test_outside_the_engine_its_names_come_from_the_package() -> None:
    """The engine's public names come from one module: outside ``engine/`` (and the bench
    and the suite, which may reach in) code imports ``verimail.engine``, never a submodule,
    so the engine can move its insides without touching the rest of the house."""
    reaching = [
        f"{path.relative_to(ROOT).as_posix()} imports {name}"
        for part, path in _modules()
        if part != "engine"
        for name in _engine_submodules_imported(path)
    ]
    assert not reaching, reaching


def test_the_engine_package_names_its_exports_and_loads_them_lazily() -> None:
    """Importing ``verimail.engine`` loads none of the engine (the command line's help must
    start fast); every name it exports then loads from the submodule its table names."""
    code = (
        "import sys, verimail.engine as engine\n"
        "print(sorted(m for m in sys.modules if m.startswith('verimail.engine.')))\n"
        "print(sorted(engine.__all__) == sorted(engine._HOMES))\n"
        "print([name for name in engine.__all__ if getattr(engine, name, None) is None])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, same_names, unresolved = run.stdout.splitlines()
    assert loaded == "[]", loaded
    assert same_names == "True"
    assert unresolved == "[]", unresolved


DOC = ROOT / "docs" / "ARCHITECTURE.md"
EDGES_START = "<!-- edges: generated from the imports by tests/test_architecture.py -->"
EDGES_END = "<!-- /edges -->"


def _edges() -> dict[str, set[str]]:
    """Each part's imports of other parts, as the code has them (the package root's version
    strings left out: every part may read them)."""
    edges: dict[str, set[str]] = {part: set() for part in MAY_IMPORT if part != ROOT_PART}
    for part, path in _modules():
        if part in edges:
            edges[part] |= (_imports(path) & set(edges)) - {part}
    return edges


def _edge_table() -> str:
    rows = ["| part | imports (of ours) |", "|---|---|"]
    for part, targets in _edges().items():
        names = ", ".join(f"`{name}`" for name in sorted(targets)) or "nothing"
        rows.append(f"| `{part}` | {names} |")
    return "\n".join(rows)


def test_the_documented_edges_are_the_imports() -> None:
    """ARCHITECTURE.md's edge table is computed from the code: when an import adds or drops
    an edge, this fails with the table to paste between its markers."""
    text = DOC.read_text()
    assert EDGES_START in text and EDGES_END in text, f"{DOC.name} lost its edge table markers"
    documented = text.split(EDGES_START, 1)[1].split(EDGES_END, 1)[0].strip()
    table = _edge_table()
    assert documented == table, (
        f"the imports changed the parts' edges: paste this between the markers of "
        f"docs/ARCHITECTURE.md (and redraw its picture if an arrow changed):\n\n{table}\n"
    )


def test_billing_has_one_door() -> None:
    """Every surface takes billing's names from ``verimail.store.billing`` (its
    ``__init__.py``, the door: quote, reserve, settle, refund, cancel), never from a module
    inside it, and nothing outside ``store/billing/`` reads the ledger's table: a rule of
    credits written elsewhere fails here. The store's own transitions reach in for the steps
    that run inside their transactions."""
    reaching = []
    for part, path in _modules():
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                module, names = node.module, {alias.name for alias in node.names}
                if part != "store" and module.startswith("verimail.store.billing."):
                    reaching.append(f"{where} imports {module}")
                outside = not where.startswith("store/billing/")
                if module == "verimail.store.tables" and "credit_ledger" in names and outside:
                    reaching.append(f"{where} reads credit_ledger")
    assert not reaching, reaching


def test_every_package_of_ours_is_installed() -> None:
    """pyproject.toml lists the packages setuptools installs one by one: a folder of code
    left off the list works in the editable checkout and is missing from a wheel."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    ours = {
        ".".join(["verimail", *init.parent.relative_to(ROOT).parts])
        for init in ROOT.rglob("__init__.py")
        if not {".venv", "tests", "bench"} & set(init.relative_to(ROOT).parts)
    }
    assert ours <= listed, sorted(ours - listed)
