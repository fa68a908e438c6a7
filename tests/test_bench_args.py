"""Bench scripts refuse bad arguments in one line (argparse's usage and error), before any model
loads, rather than with a traceback or a measurement of nothing."""

import sys

import pytest


@pytest.mark.parametrize("argv, message", [
    (["--syntaxes=xml,json"], "--syntaxes: unknown ['json']"),
    (["--limit=0"], "--limit=0: use a positive number"),
    (["--model=hf:/nonexistent"], "--model=hf:/nonexistent: "),
])
def test_syntax_probe_refuses_bad_arguments_in_one_line(argv, message, monkeypatch, capsys):
  from bench import syntax_probe  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(sys, "argv", ["syntax_probe", *argv])
  with pytest.raises(SystemExit) as e:
    syntax_probe.main()
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err, err
