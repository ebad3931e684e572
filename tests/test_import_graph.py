"""The import graph of bert_jax/, data_pipelines/, configs/, launch/ and bench/, read from the source: layers
that import only downward (docs/design.md, "Layers import downward"), no circles, no private name crossing a
package, no unexplained lazy imports.

A circle makes a module's behaviour depend on which of its members was imported first, and
hides a layer that should sit below both. The graph counts every import, top-level or not:
an import inside a function only delays a dependency, so it cannot break a circle, and each
one must say why it is delayed (a heavy or optional library, an order of start-up), on its
line or on the line above its run of imports.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# folder -> the name its modules are imported by: configs/ and launch/ are installed inside the library (setup.py)
PACKAGES = {"bert_jax": "bert_jax", "data_pipelines": "data_pipelines", "configs": "bert_jax.configs",
            "launch": "bert_jax.launch", "bench": "bench"}
LIBRARIES = ("bert_jax", "data_pipelines")  # whose in-function imports must say why

# The layer map, bottom first: (layer, its rooms). A module lives in the room whose name is the longest prefix of
# its own; it may import its own room and the rooms of lower layers, nothing beside or above it. The stages of
# data_pipelines/ are layers of their own, in the order a corpus flows through them. Commands are rooms of their own
# on top: bert_jax/commands/ (read from the folder, as the CLI reads it), the `python -m` aliases (every __main__),
# the console script and the benchmarks.
LAYERS = (
    ("the package root: UserError and the registry helper", ("bert_jax",)),
    ("the path layer", ("bert_jax.storage",)),
    ("data: sources", ("data_pipelines", "data_pipelines.sources")),
    ("data: tokenizers", ("data_pipelines.tokenizers",)),
    ("data: shards", ("data_pipelines.shards",)),
    ("data: examples", ("data_pipelines.examples",)),
    ("data: the loader", ("data_pipelines.loader",)),
    # Kernels (Pallas, custom VJPs) sit below the models that call them and import none (bert_jax/kernels/).
    ("kernels", ("bert_jax.kernels",)),
    ("models, meshes", ("bert_jax.models", "bert_jax.parallel")),
    # An objective is a loss, and may be a head too, built of the models' layers (SpanBERT's span boundary head):
    # the family registry hands the head to its model.
    ("objectives", ("bert_jax.objectives",)),
    ("checkpoints and Hugging Face conversion", ("bert_jax.checkpoint", "bert_jax.hf")),
    ("the family registry", ("bert_jax.families",)),
    ("run infrastructure", ("bert_jax.run",)),
    ("training", ("bert_jax.train",)),
    ("fine-tuning and vocabulary extension", ("bert_jax.finetune", "bert_jax.vocab")),
    ("planning and inspection", ("bert_jax.plan", "bert_jax.inspect")),
    ("configs", ("bert_jax.configs",)),
    # Launchers start runs as commands (they import no command): a command that starts runs elsewhere (`evaluate
    # --executor=ray`) goes through them.
    ("launchers", ("bert_jax.launch",)),
    ("commands, benchmarks", ("bert_jax.cli", "bert_jax.commands", "bench")),
)
COMMANDS_LAYER = len(LAYERS) - 1

# Upward or sideways imports let through while a restructuring is under way: keep it empty.
ALLOWED_UPWARD: set[tuple[str, str]] = set()  # (importer, imported)

# Circles and uncommented in-function imports let through while a restructuring is under way: keep both empty.
ALLOWED_CIRCLES: set[frozenset[str]] = set()
ALLOWED_UNCOMMENTED: set[tuple[str, str]] = set()  # (file, the import statement)


def _module_names() -> dict[str, pathlib.Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for file in sorted((ROOT / folder).rglob("*.py")):
            parts = (*package.split("."), *file.relative_to(ROOT / folder).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return modules


MODULES = _module_names()


def _resolve(name: str) -> str | None:
    """The project module `name` refers to: itself, or (for `pkg.mod.attr`) its longest known prefix."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    """Project modules an import statement loads; `from pkg import mod` counts as an import of pkg.mod."""
    if isinstance(node, ast.Import):
        return {t for t in (_resolve(alias.name) for alias in node.names) if t}
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    found = set()
    for alias in node.names:
        target = _resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else _resolve(base)
        if target:
            found.add(target)
    return found


def _room(module: str) -> tuple[int, str]:
    """(layer index, room) of a module: the room whose name is the longest prefix of the module's; a `python -m`
    alias (a __main__ module) is a command."""
    if module.rpartition(".")[2] == "__main__":
        return COMMANDS_LAYER, "bert_jax.commands"
    best = None
    for index, (_, rooms) in enumerate(LAYERS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (index, room)
    assert best, f"{module} is in no room of LAYERS: add it"
    return best


def _upward(graph: dict[str, set[str]], layers=None) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a room beside or above the importer's."""
    found = []
    for module, targets in sorted(graph.items()):
        layer, room = _room(module)
        for target in sorted(targets):
            target_layer, target_room = _room(target)
            if target_layer > layer or (target_layer == layer and target_room != room):
                found.append((module, target))
    return found


def _package(module: str) -> str:
    file = MODULES[module]
    return module if file.name == "__init__.py" else module.rpartition(".")[0]


def _private_crossings() -> list[str]:
    """`from pkg.mod import _name` or `mod._name` where mod is a project module of another package."""
    found = []
    for module, file in MODULES.items():
        tree = ast.parse(file.read_text(), str(file))
        bound = {}  # local name -> project module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in MODULES:
                        bound[alias.asname or alias.name] = full
                    elif node.module in MODULES and _is_private(alias.name) and \
                            _package(node.module) != _package(module):
                        found.append(f"{module}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in MODULES:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _is_private(node.attr) and _package(bound[node.value.id]) != _package(module)):
                found.append(f"{module}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _function_imports(tree: ast.AST):
    """Import statements that sit in a function body (at any depth)."""
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(module -> project modules it imports anywhere, in-function imports with no comment saying why)."""
    graph, uncommented = {}, []
    for module, file in MODULES.items():
        source = file.read_text()
        tree = ast.parse(source, str(file))
        is_package = file.name == "__init__.py"
        graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= _targets(node, module, is_package) - {module}
        lines = source.splitlines()
        if module.split(".")[0] not in LIBRARIES:
            continue
        for node in {id(n): n for n in _function_imports(tree)}.values():
            if not _explained(lines, node.lineno):
                uncommented.append((str(file.relative_to(ROOT)), node.lineno, lines[node.lineno - 1].strip()))
    return graph, uncommented


def _explained(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or on the line just above the run of imports it belongs to."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete circle inside a component, a -> b -> ... -> a, for the failure message."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        succ = min(s for s in graph[path[-1]] if s in members)
        if succ in seen:
            return path[path.index(succ):] + [succ]
        path.append(succ)
        seen.add(succ)


@pytest.fixture(scope="module")
def import_graph():
    return _graph()


def test_resolves_from_package_import_module_to_the_module(import_graph):
    graph, _ = import_graph
    # `from bert_jax.storage import paths` is an edge to bert_jax.storage.paths, not to the package.
    assert "bert_jax.storage.paths" in graph["data_pipelines.sources.prepared"]
    assert "bert_jax.storage" not in graph["data_pipelines.sources.prepared"]


def test_no_import_circle(import_graph):
    graph, _ = import_graph
    circles = [c for c in _circles(graph) if frozenset(c) not in ALLOWED_CIRCLES]
    assert not circles, "import circles:\n" + "\n".join(
        f"  {' -> '.join(_cycle_through(graph, c))}  (component: {', '.join(c)})" for c in circles)


def test_every_import_inside_a_function_says_why(import_graph):
    _, uncommented = import_graph
    missing = [u for u in uncommented if (u[0], u[2]) not in ALLOWED_UNCOMMENTED]
    assert not missing, ("imports inside functions without a comment (same line or the line above) saying why:\n"
                         + "\n".join(f"  {file}:{line}: {text}" for file, line, text in missing))


def test_the_allowlists_name_only_what_still_exists(import_graph):
    graph, uncommented = import_graph
    stale = [c for c in ALLOWED_CIRCLES if c not in {frozenset(c) for c in _circles(graph)}]
    stale += [u for u in ALLOWED_UNCOMMENTED if u not in {(f, text) for f, _, text in uncommented}]
    assert not stale, f"fixed, so remove them from the allowlists: {stale}"


def test_layers_import_only_downward(import_graph):
    graph, _ = import_graph
    upward = [u for u in _upward(graph) if u not in ALLOWED_UPWARD]
    assert not upward, "imports of a room beside or above the importer's (see LAYERS):\n" + "\n".join(
        f"  {a} [{LAYERS[_room(a)[0]][0]}] -> {b} [{LAYERS[_room(b)[0]][0]}]" for a, b in upward)


def test_the_layer_check_catches_an_upward_import(import_graph):
    graph, _ = import_graph
    injected = {**graph, "bert_jax.storage.workdir": graph["bert_jax.storage.workdir"] | {"bert_jax.families"}}
    assert ("bert_jax.storage.workdir", "bert_jax.families") in _upward(injected)
    beside = {**graph, "data_pipelines.loader.pipeline": graph["data_pipelines.loader.pipeline"] | {"bert_jax.models.bert"}}
    assert ("data_pipelines.loader.pipeline", "bert_jax.models.bert") in _upward(beside)
    kernel_to_model = {**graph, "bert_jax.kernels.attention": graph["bert_jax.kernels.attention"] | {"bert_jax.models.layers"}}
    assert ("bert_jax.kernels.attention", "bert_jax.models.layers") in _upward(kernel_to_model)


def test_kernels_are_the_floor_below_the_models():
    """bert_jax/kernels/ is a layer of its own under models/: models import kernels, a kernel imports no model."""
    kernels, models = _room("bert_jax.kernels.attention"), _room("bert_jax.models.attention")
    assert kernels[1] == "bert_jax.kernels" and kernels[0] == models[0] - 1


def test_no_private_name_crosses_a_package():
    crossings = _private_crossings()
    assert not crossings, "private names used from another package (make them public, or move the code):\n" + \
        "\n".join(f"  {c}" for c in crossings)


def test_modules_are_found_by_import_statements_not_by_name():
    """`importlib.import_module` hides a dependency from this graph; in the library only the console script may look commands up
    by name (bert_jax/cli.py maps each command to its module)."""
    users = [str(file.relative_to(ROOT)) for module, file in MODULES.items()
             if module.split(".")[0] in LIBRARIES and module != "bert_jax.cli" and "import_module(" in file.read_text()]
    assert not users, f"importlib.import_module outside bert_jax/cli.py: {users}"


def test_configs_and_launch_are_imported_by_their_installed_names():
    """configs/ and launch/ are installed as bert_jax.configs and bert_jax.launch (setup.py): a bare `import configs`
    works only from the repository root, and elsewhere would find a user's own package of that name."""
    files = [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py"))]
    bare = [f"{file.relative_to(ROOT)}:{node.lineno}" for file in files
            for node in ast.walk(ast.parse(file.read_text(), str(file)))
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("configs", "launch") for a in node.names)
            or isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in
            ("configs", "launch")]
    assert not bare, f"import bert_jax.configs / bert_jax.launch instead: {bare}"
