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
