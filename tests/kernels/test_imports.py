"""The kernel package's import graph, read with `ast`: no circle, and the core never imports the SGLang seam.

Every import counts, also one inside a function: a lazy import is still a dependency, and was how circles hid.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kernels" / "ddtree_kernels"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package modules an `import from` names (a name that is a submodule counts as that submodule)."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = _resolve(name, path.name == "__init__.py", node)
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            edges |= {n for n in names if n in modules and n != name}
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None. A package's own __init__ importing its submodules
    is no circle, and neither is a submodule importing a sibling (`from . import x` resolves to x)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):  # a package importing its own submodule
                continue
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_walk_sees_a_circle_when_there_is_one():
    graph = import_graph()
    assert "ddtree_kernels.plan_types" in graph["ddtree_kernels.registry"]  # it reads the package
    broken = {**graph, "ddtree_kernels.plan_types": graph["ddtree_kernels.plan_types"] | {"ddtree_kernels.registry"}}
    assert _cycle(broken) is not None


def test_no_import_circle_in_the_kernel_package():
    assert _cycle(import_graph()) is None


def test_the_core_never_imports_the_sglang_seam():
    graph = import_graph()
    seam = "ddtree_kernels.sglang"
    offenders = {m: sorted(e for e in edges if e == seam or e.startswith(seam + "."))
                 for m, edges in graph.items() if not (m == seam or m.startswith(seam + "."))}
    assert not {m: e for m, e in offenders.items() if e}


def test_planning_types_import_nothing_of_the_registry_or_launcher():
    assert import_graph()["ddtree_kernels.plan_types"] <= {"ddtree_kernels.target"}
