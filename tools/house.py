"""The shape of the code: import cycles, function-local imports, the largest files and
functions (docs/architecture.md, "Before and after").

    python tools/house.py [ROOT]

ROOT is a checkout (default: this one). The import graph is grimp's, the one import-linter
checks; a cycle is a strongly connected set of two or more modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

PACKAGES = ("fleet", "webapp", "tasks", "workers", "jobs", "db", "core", "inference", "laneway")


def cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Tarjan's strongly connected components of size two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    kids = graph.find_modules_directly_imported_by(child) & modules
                    work.append((child, iter(sorted(kids))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def functions(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    item.name = f"{node.name}.{item.name}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.end_lineno - node.lineno + 1, node.name))
    return out


def local_imports(tree: ast.AST, packages: set[str]) -> int:
    count = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                count += node.module.split(".")[0] in packages
            elif isinstance(node, ast.Import):
                count += any(a.name.split(".")[0] in packages for a in node.names)
    return count


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    sys.path.insert(0, str(root))
    present = [p for p in PACKAGES if (root / p / "__init__.py").exists()]
    graph = grimp.build_graph(*present)
    modules = set(graph.modules)
    found = cycles(graph, modules)
    print(f"packages: {', '.join(present)}")
    print(f"import cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    files, funcs, local = [], [], 0
    for package in present:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            tree = ast.parse(text)
            rel = path.relative_to(root)
            files.append((len(text.splitlines()), str(rel)))
            funcs += [(n, f"{rel}: {name}") for n, name in functions(tree)]
            local += local_imports(tree, set(present))
    print(f"production lines: {sum(n for n, _ in files)} in {len(files)} files")
    print(f"function-local imports of project modules: {local}")
    print("largest files:")
    for n, name in sorted(files, reverse=True)[:6]:
        print(f"  {n:5d} {name}")
    print("longest functions:")
    for n, name in sorted(funcs, reverse=True)[:8]:
        print(f"  {n:5d} {name}")


if __name__ == "__main__":
    main()
