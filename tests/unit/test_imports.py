"""The library's imports: cheap, and pointing one way.

``import harness`` is what every CLI call, test and user script pays first,
so it must not load a broker client, a web framework, the migration tool or
the tracing SDK (they load where they are used). And no module of
``harness/`` may import, at module level, one that imports it back, even
under ``if TYPE_CHECKING:``: such an edge hides a layering cycle that a
function-level import would only move, not remove. Imports inside function
bodies are the lazy loads the first rule asks for, and are not counted.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "harness"

#: Top-level packages that ``import harness`` and the CLI's group must not load.
FORBIDDEN = (
    "celery",
    "kombu",
    "billiard",
    "alembic",
    "fastapi",
    "uvicorn",
    "starlette",
    "opentelemetry",
)


def _loaded_after(code: str) -> set[str]:
    """The forbidden top-level packages in ``sys.modules`` after running
    ``code`` in a fresh interpreter."""
    probe = (
        f"{code}\n"
        "import sys\n"
        f"loaded = {{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})\n"
        "print('loaded:', *sorted(loaded))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    last = done.stdout.splitlines()[-1].split()
    assert last[0] == "loaded:", done.stdout
    return set(last[1:])


@pytest.mark.parametrize(
    "code",
    [
        "import harness",
        # The CLI up to building its group, as `harness --help` does.
        "import harness.cli\n"
        "harness.cli.main.make_context('harness', ['--help'], resilient_parsing=True)",
    ],
    ids=["import harness", "harness.cli group"],
)
def test_the_cheap_path_loads_no_heavy_package(code: str) -> None:
    """Neither loads celery, kombu, billiard, alembic, the web stack nor OpenTelemetry."""
    assert _loaded_after(code) == set()


def test_showing_a_run_loads_no_heavy_package(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path
) -> None:
    """``harness show RUN`` opens the store and reads: no broker client (its
    runtime's sender makes one only to send), no migration tool (the
    revision is one read), no web stack, no tracing SDK."""
    from click.testing import CliRunner

    from harness.cli import main

    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_IMPORTS", "tests.agents")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    started = CliRunner().invoke(main, ["start", "chain", "count to three", "--json"])
    assert started.exit_code == 0, started.output
    run_id = json.loads(started.stdout)["run_id"]
    show = f"from harness.cli import main\nmain(['show', {run_id!r}], standalone_mode=False)"
    assert _loaded_after(show) == set()


def test_the_migration_head_is_known_without_alembic() -> None:
    """The revision every store is checked against without loading Alembic
    (harness.store.migrate.HEAD) is the one Alembic's scripts end at."""
    from harness.store import migrate

    assert migrate.head_revision() == migrate.HEAD


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_level_imports(
    tree: ast.Module, name: str, is_package: bool, modules: frozenset[str] = frozenset()
) -> set[str]:
    """The modules ``name`` imports outside any function body (``if``,
    ``try`` and ``if TYPE_CHECKING:`` blocks included), as dotted names.
    ``from package import module`` (a name in ``modules``) is an edge to that
    module alone: the package's ``__init__`` is loaded before any module of
    it, whoever imports it, so it is no edge of this module's own."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return  # run when called: a lazy import, not a module-level edge
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                found.add(dotted if dotted in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports at module level. An import
    of a package's name counts as an edge to that package's ``__init__``."""
    paths = {_module_name(p): p for p in LIBRARY.rglob("*.py")}
    known = frozenset(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        imported = _module_level_imports(tree, name, path.name == "__init__.py", known)
        graph[name] = {m for m in imported if m in paths and m != name}
    return graph


def package_of(module: str) -> str:
    """The first two dotted components: ``harness.engine.runner`` -> ``harness.engine``."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(package_of(module), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return packages


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_is_read_whole() -> None:
    """The checker sees the edges it must: a TYPE_CHECKING import and a
    ``from package import module`` count, a function-level import does not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from harness.engine import transitions\n"
        "if TYPE_CHECKING:\n"
        "    from harness.records import Run\n"
        "def lazy():\n"
        "    import harness.cli\n"
    )
    modules = frozenset({"harness.engine.transitions", "harness.records"})
    found = _module_level_imports(ast.parse(source), "harness.engine.steps", False, modules)
    assert found == {"typing", "harness.engine.transitions", "harness.records"}
    assert "harness.cli" not in found
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_back() -> None:
    """No cycle among the modules of harness/, TYPE_CHECKING edges included."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_package_imports_itself_back() -> None:
    """No cycle among harness's packages (harness.engine, harness.store, ...;
    a top-level module is a package of its own)."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])
