"""A run's world files are the world its config names: another seed's, or files a kill cut short,
are written again whole; `overwrite` starts a run over without its old world or warm-up."""

import hashlib
import json

import chex

from scope_jax import world as world_lib
from scope_jax.core import evals
from scope_jax.world import MANIFEST, World


def _sha(path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _gold(spec: str):
  """The path of a one-item `file:<path>:<type>` spec."""
  import pathlib
  return pathlib.Path(spec[len("file:"):].rsplit(":", 1)[0])


def test_another_seed_writes_its_own_gold(tmp_path):
  root = tmp_path / "world"
  zero = _gold(world_lib.world_specs("world:hop1", 0, root))
  chex.assert_equal(_sha(zero), hashlib.sha256(World(0).files()["gold/hop1.jsonl"].encode())
                    .hexdigest())
  one = _gold(world_lib.world_specs("world:hop1", 1, root))
  expected = World(1).files()
  chex.assert_equal(one.read_text(), expected["gold/hop1.jsonl"])
  chex.assert_equal((root / "corpus.jsonl").read_text(), expected["corpus.jsonl"])
  chex.assert_equal(json.loads((root / MANIFEST).read_text())["seed"], 1)
  assert one.read_text() != World(0).files()["gold/hop1.jsonl"]


def test_files_a_kill_cut_short_are_written_again(tmp_path):
  root = tmp_path / "world"
  World(2).write(root)
  whole = (root / "gold" / "doc.jsonl").read_text()
  assert World(2).written(root)
  # What a kill during the old, in-place writes left: some files cut, no manifest.
  (root / MANIFEST).unlink()
  (root / "gold" / "doc.jsonl").write_text("\n".join(whole.splitlines()[:250]) + "\n")
  assert not World(2).written(root)
  world_lib.world_specs("world:doc", 2, root)
  chex.assert_equal((root / "gold" / "doc.jsonl").read_text(), whole)
  assert World(2).written(root)
  assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]  # temporaries renamed
  (root / MANIFEST).write_text("{damaged")
  assert not World(2).written(root)


def test_the_same_world_is_not_written_again(tmp_path):
  root = tmp_path / "world"
  world_lib.world_specs("world:arith", 4, root)
  before = (root / "gold" / "arith.jsonl").stat().st_mtime_ns
  world_lib.world_specs("world:arith,world:doc", 4, root)
  chex.assert_equal((root / "gold" / "arith.jsonl").stat().st_mtime_ns, before)
