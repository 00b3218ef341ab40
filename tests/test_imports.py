"""The package's import graph has no cycles: read from the source (every import statement, the ones inside
functions too), so a module never needs another that needs it back."""

from __future__ import annotations

import ast
from pathlib import Path

import hf_posenc

PACKAGE = Path(hf_posenc.__file__).parent

# Known, each broken by an import inside a function: loading applies a GGUF file's rope scaling with
# api.patch while api loads through loading; the CLI dispatches to the evaluate recipe, which ends its
# refusals with the CLI's helpers; a record names its family and method, which the registry holds, and the
# registry finds a patched model's family from its record.
KNOWN = {frozenset({"hf_posenc.loading", "hf_posenc.api"}), frozenset({"hf_posenc.cli", "hf_posenc.recipes.evaluate"}),
         frozenset({"hf_posenc.registry", "hf_posenc.record"})}


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["hf_posenc", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _executed(tree: ast.Module):
    """Every node of `tree` except those under `if TYPE_CHECKING:` (imports for annotations only, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, is_package: bool, known: dict) -> set[str]:
    """The package's modules `name` imports, resolved to the module (not the package) where one is named;
    imports under `if TYPE_CHECKING:` (annotations only) are not counted."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in _executed(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # a package importing its own submodules (to re-export them) is not a cycle
            if target and target != name and not (is_package and target.startswith(name + ".")):
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> set[frozenset]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.add(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_beyond_the_known_ones():
    known = modules()
    graph = {name: imports(name, path, is_package, known) for name, (path, is_package) in known.items()}
    assert "hf_posenc.api" in graph["hf_posenc.eval.variants"]  # the graph sees relative imports
    assert cycles(graph) <= KNOWN, sorted(map(sorted, cycles(graph) - KNOWN))


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
