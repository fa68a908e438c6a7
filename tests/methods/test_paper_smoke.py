"""Every paper preset with `--config.smoke=True` runs end to end on the real
Qwen2.5-Coder-0.5B-Instruct (one CPU device, its own process), within 15 minutes, and every role
that holds the search tool searches. Slow: it fetches the 0.5B GGUF once and runs the real model."""

import pytest

from bench import paper_smoke


@pytest.mark.slow
@pytest.mark.parametrize("spec", paper_smoke.PAPER_PRESETS)
def test_paper_preset_smoke_run(spec, tmp_path):
  result = paper_smoke.run(spec, tmp_path)
  assert result["rc"] == 0, result["tail"]
  assert result["wall"] < 15 * 60, result["wall"]
  assert result["rows"], "no step was recorded"
  found = paper_smoke.searches(result)
  assert set(found) == {r for r in paper_smoke.SEARCHERS[result["method"]]
                        if f"{r}/rollout/rows" in paper_smoke.merged(result["rows"])}, found
  assert all(v > 0 for v in found.values()), found


def _fake_run(calls):
  """A stand-in for one smoke run: a workdir with one metrics row, as a finished run leaves."""
  def run(spec, out, extra=()):
    calls.append(spec)
    method, preset = spec.split(":")
    workdir = out / f"{method}_{preset}"
    workdir.mkdir()  # fails if an earlier run's workdir is still there
    (workdir / "metrics.jsonl").write_text('{"step": 0}\n')
    (out / f"{method}_{preset}.log").write_text("log\n")
    return {"spec": spec, "method": method, "wall": 1.0, "rc": 0,
            "rows": [{"step": 0}], "workdir": workdir, "tail": ""}
  return run


def test_an_out_with_earlier_runs_is_refused_or_run_again(tmp_path, monkeypatch, capsys):
  """Run again on the same --out, the earlier (finished) runs would resume and their old table
  read as this code's: the command refuses in one line, or with --overwrite runs them anew."""
  calls = []
  monkeypatch.setattr(paper_smoke, "run", _fake_run(calls))
  args = ["--presets=spell:paper,asl:paper", f"--out={tmp_path}"]
  assert paper_smoke.main(args) == 0 and calls == ["spell:paper", "asl:paper"]
  capsys.readouterr()
  assert paper_smoke.main(args) == 2 and calls == ["spell:paper", "asl:paper"]
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"Error: --out={tmp_path} holds earlier runs "
                                             "(spell_paper, spell_paper.log, asl_paper"), err
  assert "--overwrite" in err[0]
  assert paper_smoke.main(["--presets=scope:paper", f"--out={tmp_path}"]) == 0  # other presets
  assert paper_smoke.main([*args, "--overwrite"]) == 0
  assert calls == ["spell:paper", "asl:paper", "scope:paper", "spell:paper", "asl:paper"]


def test_settings_and_the_format_warm_up_reach_every_run(tmp_path, monkeypatch, capsys):
  """--set=KEY=VALUE and --smoke_warmup=N become --config.KEY=VALUE and
  --config.smoke_warmup=N on every run; malformed ones are one-line errors before any run."""
  seen = []
  monkeypatch.setattr(paper_smoke, "run", lambda spec, out, extra=(): (
      seen.append(tuple(extra)), _fake_run([])(spec, out))[1])
  args = ["--presets=asl:paper", f"--out={tmp_path}", "--set=lora.rank=16", "--smoke_warmup=24"]
  assert paper_smoke.main(args) == 0
  assert seen == [("--config.lora.rank=16", "--config.smoke_warmup=24")]
  for bad, message in (("--set=lora.rank", "--set=lora.rank: give KEY=VALUE"),
                       ("--set=config.lora.rank=4", "--set=config.lora.rank=4: give KEY=VALUE"),
                       ("--smoke_warmup=-1", "--smoke_warmup=-1: give a number of steps")):
    assert paper_smoke.main([f"--out={tmp_path}/other", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
  assert seen == [("--config.lora.rank=16", "--config.smoke_warmup=24")]
