"""tools/world_reading.py refuses bad arguments in one line (argparse's usage and error),
before any model loads, rather than with a traceback or a fit of nothing."""

import sys

import pytest

from tools import world_reading


@pytest.mark.parametrize("argv, message", [
    (["--world=1000"], "--world=1000 is one of the training worlds (seeds 1000 to 1019)"),
    (["--world=1004", "--worlds=5"], "--world=1004 is one of the training worlds"),
    (["--every=0"], "--every=0: use a positive number"),
    (["--limit=0"], "--limit=0: use a positive number"),
    (["--worlds=0"], "--worlds=0: use a positive number"),
    (["--steps=700", "--every=500"], "--steps=700: use 0 (measure only) or a multiple"),
    (["--world=-1"], "--world=-1: use a non-negative seed"),
])
def test_world_reading_refuses_bad_arguments(argv, message, monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["world_reading", *argv])
  monkeypatch.setattr(world_reading, "load_tokenizer", lambda *_: pytest.fail("loaded a model"))
  with pytest.raises(SystemExit) as e:
    world_reading.main()
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_a_held_out_world_past_the_training_worlds_is_accepted(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["world_reading", "--world=1020", "--worlds=20"])

  class Loaded(Exception):
    pass

  def stop(*_):
    raise Loaded
  monkeypatch.setattr(world_reading, "load_tokenizer", stop)
  with pytest.raises(Loaded):
    world_reading.main()
