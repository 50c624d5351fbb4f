"""The package's layers import one way (config -> data -> model -> checkpoint -> decoding -> engines ->
export, serving and training; training -> doctor; everything -> cli), no module imports itself back
through others, and inference stands without training."""

import ast
import functools
from pathlib import Path

import attn_cli

PACKAGE = Path(attn_cli.__file__).parent
FOUNDATION = {"config", "paths", "errors", "files", "vocab", "languages"}
# Loading a model, below every use of one: checkpoints, and the device a model is built on.
CHECKPOINT = {"checkpoint", "device"}
# What each layer may import of attn_cli, besides itself and the foundation modules.
ALLOWED = {
    "foundation": set(),
    "data": set(),
    "model": set(),
    "checkpoint": {"data", "model"},
    "decoding": {"data", "model"},
    "engines": {"data", "model", "checkpoint", "decoding"},
    "export": {"data", "model", "checkpoint", "decoding", "engines"},
    "serving": {"data", "model", "checkpoint", "decoding", "engines"},
    "huggingface": {"data", "model", "checkpoint"},
    "training": {"data", "model", "checkpoint", "decoding", "engines"},
    "doctor": {"data", "model", "checkpoint", "decoding", "engines", "training"},
    "cli": {
        "data",
        "model",
        "checkpoint",
        "decoding",
        "engines",
        "export",
        "serving",
        "huggingface",
        "training",
        "doctor",
    },
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, packages: bool = False) -> dict[str, str]:
    """Every attn_cli module this file imports, at any depth of the file, each with the first import
    statement that does (where it is, what it says). With `packages`, also the packages whose
    __init__.py those imports run (`_packages_run`)."""
    module = _module_name(path)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        named: list[tuple[str, str]] = []  # (the module the statement names, the module it imports)
        if isinstance(node, ast.Import):
            named = [(alias.name, alias.name) for alias in node.names if alias.name.startswith("attn_cli")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attn_cli"):
            for alias in node.names:  # `from attn_cli.x import y` imports x.y when y is a module
                submodule = f"{node.module}.{alias.name}"
                named.append((node.module, submodule if _exists(submodule) else node.module))
        if not named:
            continue
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)} `{ast.unparse(node)}`"
        for name, target in named:
            for package in _packages_run(module, name, target) if packages else []:
                found.setdefault(package, f"{where} runs {package.replace('.', '/')}/__init__.py")
            found.setdefault(target, f"{where} imports {target}")
    return found


def _packages_run(module: str, named: str, target: str) -> list[str]:
    """The packages whose __init__.py an import in `module` runs on the way to `target`: importing
    a.b.c (or `from a.b import c`) runs a/__init__.py and a/b/__init__.py first. Not a package that
    holds `module` itself, whose __init__.py began before `module` ran, unless the statement names
    it: `from a.b import c` in a/b/x.py reads the package a.b, which is only half built when it is
    a/b/__init__.py that imports x (a/b/x.py importing a.b.c by its full name does not)."""
    parts = module.split(".")
    holders = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    above = target.split(".")
    packages = [".".join(above[:end]) for end in range(1, len(above))]
    return [p for p in packages if p != module and (p not in holders or p == named)]


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in FOUNDATION:
        return "foundation"
    if parts[1] in CHECKPOINT:
        return "checkpoint"
    assert parts[1] in ALLOWED, f"{module} belongs to no layer: add it to FOUNDATION or ALLOWED"
    return parts[1]


@functools.cache  # parsed once for all the tests: the files do not change while they run
def _graph(packages: bool = False) -> dict[str, dict[str, str]]:
    """module -> {each attn_cli module it imports: the statement that does}."""
    return {_module_name(path): _imports(path, packages) for path in PACKAGE.rglob("*.py")}


LEAVES = ("attn_cli.errors", "attn_cli.languages")  # the foundation's own foundation: they import nothing of attn


def test_each_layer_imports_only_the_layers_before_it():
    wrong = []
    for module, imported in _graph().items():
        if module in ("attn_cli", "attn_cli.__main__"):
            continue
        layer = _layer(module)
        for target in imported:
            target_layer = _layer(target)
            if target_layer not in {layer, "foundation"} | ALLOWED[layer]:
                wrong.append(f"{module} ({layer}) imports {target} ({target_layer})")
            if layer == "foundation" and target_layer == "foundation" and target not in (module, *LEAVES):
                wrong.append(
                    f"{module} imports {target}: the foundation modules import nothing of attn "
                    f"but errors and languages, which import nothing"
                )
    for leaf in LEAVES:
        assert not [target for target in _graph()[leaf] if target != leaf], f"{leaf} imports attn modules"
    assert not wrong, "\n".join(wrong)


def test_the_model_imports_nothing_but_torch_and_its_ids():
    for path in (PACKAGE / "model").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for name in names:
                    top = name.split(".")[0]
                    assert top in {"torch", "math", "dataclasses", "typing", "__future__", "attn_cli"}, (path, name)
                    if top == "attn_cli":  # the config only for build_model's annotation
                        allowed = ("attn_cli.model", "attn_cli.vocab") + (
                            ("attn_cli.config",) if path.name == "transformer.py" else ()
                        )
                        assert name.startswith(allowed), (path, name)


def test_no_module_imports_itself_back_through_others():
    """Imports count at any depth of a file, as in the layer test, and so do the packages' __init__.py
    files they run (`_packages_run`): a/b/x.py doing `from a.b import c`, where a/b/__init__.py
    imports a/b/y.py, which imports a/b/x.py, is a loop."""
    graph = _graph(packages=True)
    state: dict[str, str] = {}
    cycles: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":  # an import back into the trail: a loop
                cycle = trail[trail.index(target) :] + [target]
                steps = [f"    {graph[a][b]}" for a, b in zip(cycle, cycle[1:])]
                cycles.append("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(steps))
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    if cycles:
        raise AssertionError("\n".join(cycles))


# Inference: what translating, scoring and exporting a trained model runs, and what a server or a
# notebook that only translates imports.
INFERENCE = [
    "attn_cli.checkpoint",
    "attn_cli.device",
    "attn_cli.cli.translate",
    "attn_cli.cli.eval",
    "attn_cli.cli.export",
    "attn_cli.export.argos",
    "attn_cli.huggingface.importing",
    "attn_cli.huggingface.exporting",
    "attn_cli.cli.importing",
    "attn_cli.cli.decoding_flags",
    "attn_cli.cli.serve",
]


def _reachable(start: str, graph: dict[str, set[str]]) -> dict[str, str]:
    """Every module `start` imports, directly or through others, each with the module that imports it."""
    found, todo = {}, [start]
    while todo:
        module = todo.pop()
        for target in graph.get(module, ()):
            if target not in found and target != start:
                found[target] = module
                todo.append(target)
    return found


def test_inference_imports_nothing_of_training():
    graph = _graph()
    starts = INFERENCE + sorted(
        m
        for m in graph
        if m.startswith(("attn_cli.decoding", "attn_cli.engines", "attn_cli.export", "attn_cli.serving"))
    )
    wrong = []
    for start in starts:
        for target, importer in _reachable(start, graph).items():
            if target.startswith("attn_cli.training"):
                wrong.append(f"{start} reaches {target} (imported by {importer})")
    assert not wrong, "\n".join(wrong)
