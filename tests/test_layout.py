"""docket/ never imports chaos/: the recorder must stand without its harness.

The one door is the design's: a CLI verb of the harness (`docket stub`, later
`docket chaos`, `docket game-day`) imports it lazily, inside the verb's function
in docket/cli.py, so the recorder never loads it unless that verb is asked for.
"""

from __future__ import annotations

import ast
from pathlib import Path

DOCKET = Path(__file__).resolve().parent.parent / "docket"
LAZY_DOOR = "docket/cli.py"


def chaos_imports(source: str) -> list[tuple[str, bool]]:
    """(module, inside a function?) for each import of `chaos` or a module under it."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.extend((n, in_function) for n in names if n == "chaos" or n.startswith("chaos."))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def test_the_detector_sees_every_way_of_importing_chaos():
    source = (
        "import os\nimport chaos.grammar\n"
        "if True:\n    from chaos import schedule\n"
        "def f():\n    import chaos\n"
        "class C:\n    async def g(self):\n        from chaos.stub import cli\n"
    )
    assert chaos_imports(source) == [
        ("chaos.grammar", False),
        ("chaos", False),
        ("chaos", True),
        ("chaos.stub", True),
    ]
    assert chaos_imports("import chaotic\nfrom .chaos import x\n") == []


def test_no_module_under_docket_imports_chaos():
    files = sorted(DOCKET.rglob("*.py"))
    assert len(files) > 10  # the walk really found the package
    offenders = {}
    for path in files:
        name = path.relative_to(DOCKET.parent).as_posix()
        hits = chaos_imports(path.read_text(encoding="utf-8"))
        bad = [module for module, lazy in hits if not (lazy and name == LAZY_DOOR)]
        if bad:
            offenders[name] = bad
    assert offenders == {}


# ---------------------------------------------------------------- no import circles
#
# The import graph of docket/ and chaos/, read from the source: every `import` and
# `from ... import`, at module level or inside a function or an `if TYPE_CHECKING:`
# (a lazy import is still a dependency, and a circle through one is still a circle).
# An import names the most specific module of the tree it reaches: `from a.b import c`
# is a.b.c when that is a module, else a.b (a package's own module is its __init__.py).
#
# Module level: no module reaches itself. Package level, at every level of the tree:
# the children of a package (its modules, and its subpackages taken whole) import
# one another in one direction only, so a room never both uses and is used by another
# room of the same house. docket and chaos themselves are the one exception, one level
# up: docket/cli.py's lazy door to the harness (above) against chaos's use of the
# recorder; no module circle goes through it, which the module check sees.

TREE = DOCKET.parent
ROOTS = ("docket", "chaos")


def module_names(root: Path = TREE, tops: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the given top packages."""
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, source: str, modules: set[str], is_package: bool) -> set[str]:
    """The tree's modules that `source` (module `name`) imports, anywhere in its body."""
    package = name if is_package else name.rpartition(".")[0]

    def known(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts.pop()
        return None

    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(filter(None, (known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                hit = full if full in modules else known(origin)
                if hit:
                    out.add(hit)
    out.discard(name)
    return out


def import_graph(root: Path = TREE, tops: tuple[str, ...] = ROOTS) -> dict[str, set[str]]:
    files = module_names(root, tops)
    names = set(files)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), names, path.stem == "__init__")
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected part of more than one node, each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graphs here are a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def child_of(package: str, module: str) -> str | None:
    """The child of `package` that holds `module` (None: not under it)."""
    if module == package:
        return package  # the package's own __init__.py
    prefix = package + "."
    if not module.startswith(prefix):
        return None
    return prefix + module[len(prefix) :].split(".")[0]


def package_cycles(graph: dict[str, set[str]]) -> dict[str, list[list[str]]]:
    """For each package, the circles among its children (modules, subpackages whole)."""
    packages = {name.rpartition(".")[0] for name in graph if "." in name} | set(ROOTS)
    out = {}
    for package in sorted(packages):
        children: dict[str, set[str]] = {}
        for module, targets in graph.items():
            here = child_of(package, module)
            if here is None:
                continue
            reached = (child_of(package, target) for target in targets)
            children.setdefault(here, set()).update(c for c in reached if c not in (None, here))
        found = cycles(children)
        if found:
            out[package] = found
    return out


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "docket"
    (pkg / "inner").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from docket import b\n",  # a module imported from its package
        "b.py": "def f():\n    from .inner import c\n",  # lazy, relative
        "inner/__init__.py": "",
        "inner/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    import docket.a\nimport os\n",
        "inner/d.py": "from docket.inner.c import thing\nfrom ..b import f\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(tmp_path, ("docket",))
    assert graph == {
        "docket": set(),
        "docket.a": {"docket.b"},
        "docket.b": {"docket.inner.c"},
        "docket.inner": set(),
        "docket.inner.c": {"docket.a"},
        "docket.inner.d": {"docket.inner.c", "docket.b"},
    }
    assert cycles(graph) == [["docket.a", "docket.b", "docket.inner.c"]]
    # one level up the same circle is docket.a -> docket.b -> docket.inner -> docket.a
    assert package_cycles(graph) == {"docket": [["docket.a", "docket.b", "docket.inner"]]}


def test_a_package_circle_is_seen_where_no_module_circle_is():
    graph = {  # guards.caps uses policy, policy uses guards.egress: no module circle
        "docket.guards.caps": {"docket.policy"},
        "docket.guards.egress": set(),
        "docket.policy": {"docket.guards.egress"},
    }
    assert cycles(graph) == []
    assert package_cycles(graph) == {"docket": [["docket.guards", "docket.policy"]]}


def test_no_module_imports_itself_round_a_circle():
    graph = import_graph()
    assert len(graph) > 100  # the walk really read both trees
    found = cycles(graph)
    assert found == [], f"modules that import each other, round a circle: {found}"


def test_no_room_imports_a_room_that_imports_it():
    found = package_cycles(import_graph())
    assert found == {}, f"rooms that import each other (package: circles): {found}"
