"""The core and the layers under the methods name no method: a method lives in its own package
(`scope_jax/methods/<m>/`), so adding one touches only that package and its config. Every
identifier, string (docstrings included) and comment of these packages is searched for a method's
name; a hit fails naming file:line."""

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scope_jax"
CHECKED = ("core", "configs_base.py", "evaluation", "models", "sampling", "rollout", "rl",
           "retrieval", "world")

# Method names in any case, whole words where `_` also separates (`spell_demos`, `ASL_TOPICS`).
NAMES = re.compile(r"(?<![a-z0-9])(spell|opensir|piplay|asl|(pi|π)-play)(?![a-z0-9])", re.I)
# "SCOPE" is the paper's name; "scope" is also English ("in scope"), so the lower-case word counts
# only where it is a reference: a config path or preset (`scope.stage1_*`, `scope:paper`), a module
# or file (`methods.scope`, `methods/scope`, `configs/scope.py`), a quoted name ("scope", `scope`)
# or a part of an identifier (`scope_rewards`).
SCOPE = re.compile(
    r"(?<![A-Za-z0-9])SCOPE(?![A-Za-z0-9])"
    r"|(?<![A-Za-z0-9_])scope(?=[.:/][A-Za-z_])"
    r"|(?<=[./])scope(?![A-Za-z0-9_])"
    r"|(?<=[\"'`])scope(?=[\"'`])")
# Words that contain a method's name and name no method, each with its reason.
ALLOWED = {
    "scope_jax": "the package's own name (and its SCOPE_JAX_* environment variables)",
    "named_scope": "jax.named_scope, a label in profiles",
}
_ALLOWED = re.compile("|".join(re.escape(w) for w in ALLOWED), re.I)


def method_names(text: str, identifier: bool = False) -> list[str]:
  """The method names `text` mentions (an identifier's `_`-separated parts are words too)."""
  text = _ALLOWED.sub(lambda m: " " * len(m.group()), text)
  hits = [m.group() for m in NAMES.finditer(text)] + [m.group() for m in SCOPE.finditer(text)]
  if identifier:
    hits += [part for part in text.split("_") if part == "scope"]
  return hits


def _identifiers(node: ast.AST):
  if isinstance(node, ast.Name):
    yield node.id
  elif isinstance(node, ast.Attribute):
    yield node.attr
  elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    yield node.name
  elif isinstance(node, ast.arg):
    yield node.arg
  elif isinstance(node, ast.keyword) and node.arg:
    yield node.arg
  elif isinstance(node, ast.alias):
    yield from (n for n in (node.name, node.asname) if n)
  elif isinstance(node, ast.ImportFrom) and node.module:
    yield node.module


def findings(source: str, name: str = "<source>") -> list[str]:
  """'file:line: what' for every method name in `source`'s identifiers, strings and comments."""
  out = []
  for node in ast.walk(ast.parse(source)):
    line = getattr(node, "lineno", 0)
    for ident in _identifiers(node):
      out += [f"{name}:{line}: identifier {ident!r} names {h!r}"
              for h in method_names(ident, identifier=True)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      quoted = f'"{node.value}"'  # a string that is just a name counts as a quoted name
      out += [f"{name}:{line}: string names {h!r}" for h in method_names(quoted)]
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      out += [f"{name}:{tok.start[0]}: comment names {h!r}" for h in method_names(tok.string)]
  return sorted(set(out), key=lambda f: int(f.split(":")[1]))


def files(package: str) -> list[pathlib.Path]:
  path = PACKAGE / package
  return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def _check(package: str) -> None:
  found = [f for p in files(package)
           for f in findings(p.read_text(), str(p.relative_to(ROOT)))]
  assert not found, "method names in a package under the methods:\n" + "\n".join(found)


@pytest.mark.parametrize("package", CHECKED)
def test_names_no_method(package):
  assert files(package), package
  _check(package)



@pytest.mark.parametrize("source", [
    'RULES = (("scope.stage1_grader_temperature", 1),)',
    "x = 1  # SCOPE grades greedily",
    "from scope_jax.methods.scope import rewards",
    "from scope_jax.methods import spell",
    "import scope_jax.methods.piplay.demos",
    'x = "configs/scope.py:paper"',
    "x = 'scope'",
    'def f():\n  """As π-Play\'s examiner does."""',
    'x = "pi-play"',
    "spell_demos = 1",
    "ASL_TOPICS = 2",
    "def scope_rewards(): pass",
    "f(opensir=1)",
    "x = 1  # `scope` asks",
    'x = f"{a} --config=configs/spell.py"',
])
def test_a_method_name_is_found(source):
  assert findings(source), source


@pytest.mark.parametrize("source", [
    "import scope_jax\nfrom scope_jax.core import bounds",
    "with jax.named_scope('attention'): pass",
    'ENV = "SCOPE_JAX_SPLASH"',
    "x = 1  # out of scope. Then the rest",
    "x = 1  # the scope of a role: its prompt",
    'x = "a misspelled word is spelled out"',
    "x = 1  # Search-R1's server, Dr.Zero's scripts",
    'x = "scope_jax.methods."',
])
def test_ordinary_words_are_not_method_names(source):
  assert not findings(source), findings(source)
