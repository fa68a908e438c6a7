"""The folder tree is the architecture: the import graph has no cycle, lower layers never import
the layers built on them, no method imports another, and no script edits sys.path."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scope_jax"
LOWER = ("models", "sampling", "rollout", "rl", "retrieval")  # the layers under the core
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


def test_the_import_graph_has_no_cycle():
  state: dict[str, int] = {}  # 1 = on the current path, 2 = done

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(GRAPH[node]):
      if state.get(nxt) == 1:
        pytest.fail("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
      if nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = 2

  for name in sorted(GRAPH):
    if name not in state:
      visit(name, [name])


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


def test_the_core_and_evaluation_never_import_a_method():
  bad = [f"{n} imports {d}" for n, deps in GRAPH.items() for d in deps
         if n.split(".")[1:2] in (["core"], ["evaluation"], ["models"], ["sampling"],
                                  ["rollout"], ["rl"], ["retrieval"], ["rewards"])
         and d.startswith("scope_jax.methods.") and not n.startswith("scope_jax.evaluation")]
  assert not bad, bad
  # evaluation reads two judge formats from the methods' reward parsers, never their algorithms
  for n, deps in GRAPH.items():
    if n.startswith("scope_jax.evaluation"):
      assert not [d for d in deps if d.startswith("scope_jax.core")], n
      assert all(d.endswith(".rewards") for d in deps if d.startswith("scope_jax.methods.")), n


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
