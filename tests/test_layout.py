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
