"""Prompt templates (text files per method and role), rendered by name substitution.

`render` replaces only the named `{field}` placeholders, so literal JSON braces in a template and
braces inside substituted text (documents, model output) are left alone.
"""

from __future__ import annotations

import functools
import pathlib

ROOT = pathlib.Path(__file__).parent


@functools.lru_cache(maxsize=None)
def load(method: str, name: str) -> str:
  path = ROOT / method / f"{name}.txt"
  if not path.exists():
    raise FileNotFoundError(f"No prompt template {method}/{name}.txt; available: "
                            f"{sorted(p.stem for p in (ROOT / method).glob('*.txt'))}.")
  return path.read_text(encoding="utf-8").strip()


def render(template: str, **fields) -> str:
  missing = [k for k in fields if "{" + k + "}" not in template]
  if missing:
    raise KeyError(f"Template has no placeholder for {missing}.")
  out = template
  for key, value in fields.items():
    out = out.replace("{" + key + "}", str(value))
  return out
