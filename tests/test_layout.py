"""The folder tree is the architecture: the import graph has no cycle, between modules or between
packages, lower layers never import the layers built on them, no method imports another, and no
script edits sys.path."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scope_jax"
LOWER = ("models", "sampling", "rollout", "rl", "retrieval", "world", "rewards")  # under the core
UPPER = ("core", "methods", "evaluation")  # what the lower layers must not import
METHODS = ("spell", "scope", "opensir", "asl", "piplay")


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: pathlib.Path) -> set[str]:
  """The package modules `path` imports at any depth of its code (a name imported from a package
  counts as that submodule when there is one, else as the package's __init__)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name.startswith("scope_jax"))
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scope_jax"):
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        out.add(sub if sub in MODULES else node.module)
  return out


GRAPH = {name: imports(path) & set(MODULES) for name, path in MODULES.items()}


def package(module: str) -> str:
  """The unit of the package graph: `scope_jax.<p>` for a subpackage's module or a top-level
  module, `scope_jax` for the root's own __init__."""
  return ".".join(module.split(".")[:2])


PACKAGES = {package(n): set() for n in GRAPH}
for _name, _deps in GRAPH.items():
  PACKAGES[package(_name)].update(package(d) for d in _deps if package(d) != package(_name))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first search)."""
  state: dict[str, int] = {}  # 1 = on the current path, 2 = done

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state and (found := visit(nxt, path + [nxt])):
        return found
    state[node] = 2
    return None

  for name in sorted(graph):
    if name not in state and (found := visit(name, [name])):
      return found
  return None


def test_the_import_graph_has_no_cycle():
  cycle = find_cycle(GRAPH)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_package_graph_has_no_cycle():
  """No exemption: a piece two packages share moves down into a package both may import."""
  cycle = find_cycle(PACKAGES)
  assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_and_shown():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert PACKAGES["scope_jax.methods"] >= {"scope_jax.core"}  # the graph is read at all


@pytest.mark.parametrize("layer", LOWER)
def test_lower_layers_import_nothing_built_on_them(layer):
  bad = []
  for name, deps in GRAPH.items():
    if name.split(".")[1:2] != [layer]:
      continue
    for dep in deps:
      top = dep.split(".")[1] if dep.count(".") else ""
      if top in UPPER or (top == "data" and dep != "scope_jax.data"):
        bad.append(f"{name} imports {dep}")
  assert not bad, bad


def test_data_holds_bundled_files_and_their_paths_only():
  code = [p.relative_to(ROOT) for p in (PACKAGE / "data").rglob("*.py") if p.name != "__init__.py"]
  assert not code, f"code under scope_jax/data: {code}"
  assert not GRAPH["scope_jax.data"], GRAPH["scope_jax.data"]


@pytest.mark.parametrize("layer", LOWER + ("evaluation", "core"))
def test_the_layers_under_the_methods_never_import_one(layer):
  bad = [f"{n} imports {d}" for n, deps in GRAPH.items() if n.split(".")[1:2] == [layer]
         for d in deps if d == "scope_jax.methods" or d.startswith("scope_jax.methods.")]
  assert not bad, bad


def test_evaluation_never_imports_the_core():
  bad = [f"{n} imports {d}" for n, deps in GRAPH.items() if n.startswith("scope_jax.evaluation")
         for d in deps if d.startswith("scope_jax.core")]
  assert not bad, bad


@pytest.mark.parametrize("method", METHODS)
def test_no_method_imports_another(method):
  own = f"scope_jax.methods.{method}"
  bad = [f"{n} imports {d}" for n, deps in GRAPH.items() if n.startswith(own + ".") or n == own
         for d in deps if d.startswith("scope_jax.methods.") and not d.startswith(own)]
  assert not bad, bad


def test_every_method_is_a_package_with_its_algorithm():
  for m in METHODS:
    assert f"scope_jax.methods.{m}.algorithm" in MODULES
  flat = [p.name for p in (PACKAGE / "methods").glob("*.py") if p.name != "__init__.py"]
  assert not flat, f"loose method files: {flat}"


@pytest.mark.parametrize("folder", ["configs", "bench", "launch", "tools"])
def test_no_script_edits_sys_path(folder):
  bad = [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py")
         if "sys.path" in p.read_text()]
  assert not bad, bad
