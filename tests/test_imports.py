"""The package's import graph: read from the source (every import statement, the ones inside functions and under
`if TYPE_CHECKING:` too), it
has no cycles, and no module imports from a layer above its own (docs/ARCHITECTURE.md's layer table, LAYERS
here). Importing a submodule runs its packages' __init__ too, so an import of `hf_posenc.families.x` counts as
one of `hf_posenc.families` as well."""

from __future__ import annotations

import ast
from pathlib import Path

import hf_posenc

PACKAGE = Path(hf_posenc.__file__).parent

# Cycles the graph may still hold (none: the last, cli <-> recipes.evaluate, went with hf_posenc/user_input.py).
KNOWN: set[frozenset[str]] = set()

# docs/ARCHITECTURE.md's layers, bottom first: a module imports from its own layer (no cycle) or the ones below.
# A module is in the layer of the longest prefix listed (`hf_posenc.methods` takes every method module).
LAYERS = {
    "errors and records": ("hf_posenc.errors", "hf_posenc.named", "hf_posenc.record"),
    "transformers": ("hf_posenc._compat", "hf_posenc.export", "hf_posenc.export.gguf_header", "hf_posenc.assets"),
    "plans": ("hf_posenc.plan",),
    "interfaces": ("hf_posenc.config", "hf_posenc.family"),
    "mechanisms and methods": ("hf_posenc.attention", "hf_posenc.methods"),
    "record reading": ("hf_posenc.record_reader",),
    "families": ("hf_posenc.families",),
    "patch calls": ("hf_posenc.registry", "hf_posenc.export.serving", "hf_posenc.export.gguf_tokenizer",
                    "hf_posenc.export.gguf_writer", "hf_posenc.loading", "hf_posenc.api", "hf_posenc.configs"),
    "uses": ("hf_posenc.causal_lm", "hf_posenc.eval", "hf_posenc.analysis", "hf_posenc.metrics", "hf_posenc.corpora",
             "hf_posenc.train", "hf_posenc.search"),
    "front ends": ("hf_posenc", "hf_posenc.user_input", "hf_posenc.cli", "hf_posenc.demo", "hf_posenc.recipes"),
}


def layer(module: str) -> int:
    """The index in LAYERS of `module`'s layer (by the longest listed prefix); KeyError when none lists it."""
    best = max(((len(prefix), i) for i, prefixes in enumerate(LAYERS.values()) for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), default=None)
    if best is None:
        raise KeyError(module)
    return best[1]


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["hf_posenc", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports(name: str, path: Path, is_package: bool, known: dict) -> set[str]:
    """The package's modules `name` imports, resolved to the module (not the package) where one is named; imports
    under `if TYPE_CHECKING:` count too (an annotation that names a module above is a dependency all the same)."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
            # importing a module runs its packages' __init__ first (not the root's: it loads names lazily)
            parents = [target.rsplit(".", depth)[0] for depth in range(1, target.count("."))]
            for found in (target, *parents):
                # a package importing its own submodules (to re-export them) is not a cycle
                if found and found != name and not (is_package and found.startswith(name + ".")) \
                        and not name.startswith(found + "."):
                    out.add(found)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, is_package, known) for name, (path, is_package) in known.items()}


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
    edges = graph()
    assert "hf_posenc.api" in edges["hf_posenc.eval.variants"]  # the graph sees relative imports
    assert "hf_posenc.methods" in edges["hf_posenc.families.rope_models"]  # and the packages a submodule runs
    assert cycles(edges) <= KNOWN, sorted(map(sorted, cycles(edges) - KNOWN))


def test_every_module_has_a_layer():
    unplaced = sorted(name for name in modules() if not _has_layer(name))
    assert not unplaced, f"modules in no layer: {unplaced}; add them to LAYERS here and to docs/ARCHITECTURE.md"


def _has_layer(name: str) -> bool:
    try:
        layer(name)
    except KeyError:
        return False
    return True


def test_no_module_imports_from_a_layer_above_its_own():
    names = list(LAYERS)
    up = sorted(f"{name} ({names[layer(name)]}) imports {target} ({names[layer(target)]})"
                for name, targets in graph().items() if _has_layer(name)
                for target in targets if _has_layer(target) and layer(target) > layer(name))
    assert not up, "imports that go up a layer (docs/ARCHITECTURE.md):\n" + "\n".join(up)


def test_the_layer_check_sees_an_import_inside_a_function_and_one_for_annotations(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from .api import patch\nif TYPE_CHECKING:\n    from .plan import PatchPlan\n")
    known = {"hf_posenc.config": (module, False), "hf_posenc.api": (module, False), "hf_posenc.plan": (module, False)}
    assert imports("hf_posenc.config", module, False, known) == {"hf_posenc.api", "hf_posenc.plan"}
    assert layer("hf_posenc.api") > layer("hf_posenc.config")
    assert layer("hf_posenc.methods.yarn") == layer("hf_posenc.attention") < layer("hf_posenc.families.gpt2")


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


def test_every_top_level_module_has_code_of_its_own():
    """No module of the package only hands over another (a forwarder left by a move): each defines something."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        defines = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))]
        assert defines or path.name == "__init__.py", f"{path.relative_to(PACKAGE)} defines nothing of its own"
        assert "sys.modules[__name__]" not in path.read_text(), f"{path.relative_to(PACKAGE)} hands over a module"


def test_only_the_command_line_imports_the_demo():
    """The demo is a front end of its own: a recipe or a library module that needs one of its pieces takes it from
    where the piece lives (the pass progress bar is hf_posenc.eval.perplexity's)."""
    users = sorted(name for name, targets in graph().items() if "hf_posenc.demo" in targets)
    assert users == ["hf_posenc.cli"], users
