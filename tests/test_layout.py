"""The house a newcomer opens: the lesson at the root, tests and tools in rooms of their own, and modules
that import each other in one direction only (no loop, and no import hidden in a function to dodge one)."""

import ast
import os
import subprocess

import pytest

from tests.launch import HERE

MODULES = {}  # module name -> its file, for every module of this repository that Python can import by name
for folder, prefix in (("", ""), ("harness", "harness."), ("tools", "tools."), ("tests", "tests.")):
    for name in sorted(os.listdir(os.path.join(HERE, folder))):
        if name.endswith(".py"):
            module = "harness" if name == "__init__.py" else prefix + name[:-3]
            MODULES[module] = os.path.join(HERE, folder, name)


def imports(path):
    """The modules of this repository that a file imports, and the imports it makes inside a function or class."""
    tree = ast.parse(open(path).read())
    named, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # `from harness import pictures` imports the module harness.pictures
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                     for alias in node.names]
        else:
            continue
        named.update(name for name in names if name in MODULES)
        if node not in tree.body:
            nested.append(f"{os.path.relpath(path, HERE)}:{node.lineno}")
    return named, nested


def test_the_root_shows_the_lesson():
    """At most 16 entries besides the numbered scripts, the design card's test_equivalence.py among them."""
    tracked = subprocess.run(["git", "ls-files"], cwd=HERE, capture_output=True, text=True, check=True).stdout.split()
    entries = {path.split("/")[0] for path in tracked}
    others = sorted(entry for entry in entries if not entry[:2].isdigit())
    assert len(others) <= 16, others
    assert "test_equivalence.py" in entries and not [entry for entry in others if entry.startswith("test_")
                                                     and entry != "test_equivalence.py"], others


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_inside_a_function(module):
    assert not imports(MODULES[module])[1]


def test_no_import_loop():
    """Following every import from every module never leads back to it; and nothing imports conftest.py."""
    graph = {module: imports(path)[0] for module, path in MODULES.items()}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            assert module != start, f"{start} imports itself through {sorted(seen)}"
            if module not in seen:
                seen.add(module)
                todo += graph[module]
    assert not [module for module, path in MODULES.items() if "conftest" in imports(path)[0]]


LESSON = ["common", "schedules", "theory"]  # what the numbered scripts run or print


def test_imports_go_from_the_lab_to_the_lesson():
    """The lesson's modules and the numbered scripts import no tool and no test, and the harness no tool, nor
    schedules.py but in harness.layout, which replays the script's own table for --partition balanced: the harness
    observes and lays out, and the search, the costed replay and the held-bytes model are tools/'s."""
    scripts = sorted(name for name in os.listdir(HERE) if name[:2].isdigit() and name.endswith(".py"))
    for path in [MODULES[module] for module in LESSON] + [os.path.join(HERE, name) for name in scripts]:
        named = imports(path)[0]
        assert not [module for module in named if module.startswith(("tools", "tests"))], (path, named)
    for module in [module for module in MODULES if module.startswith("harness")]:
        named = imports(MODULES[module])[0]
        not_for_it = {other for other in MODULES if other.startswith("tools")}
        if module != "harness.layout":
            not_for_it.add("schedules")
        assert not named & not_for_it, (module, named)


def test_no_flag_is_declared_twice():
    """Every flag the harness or a tool declares, it declares once: shared ones come from harness.flags.FLAGS."""
    declared = []
    for module, path in MODULES.items():
        if module.startswith(("harness", "tools")):
            tree = ast.parse(open(path).read())
            declared += [node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
                         and getattr(node.func, "attr", None) == "add_argument" and node.args
                         and isinstance(node.args[0], ast.Constant)]
            declared += [key.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                         and getattr(node.targets[0], "id", None) == "FLAGS" for key in node.value.keys]
    assert len(declared) > 20 and len(declared) == len(set(declared)), sorted(declared)
