"""Prompt templates (text files per method and role), rendered by name substitution.

`render` replaces the named `{field}` placeholders in one pass over the template: literal JSON
braces in a template, and braces or placeholder-like text inside substituted values (documents,
model output), are left alone. A `Prompt` also names which of its fields may be cut when the
rendered prompt exceeds its role's token limit (`fit`): the inserted content (documents, answers)
shrinks, never the instructions.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from typing import Any, Callable, Mapping

ROOT = pathlib.Path(__file__).parent
ELLIPSIS = " …"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@functools.lru_cache(maxsize=None)
def load(method: str, name: str) -> str:
  path = ROOT / method / f"{name}.txt"
  if not path.exists():
    raise FileNotFoundError(f"No prompt template {method}/{name}.txt; available: "
                            f"{sorted(p.stem for p in (ROOT / method).glob('*.txt'))}.")
  return path.read_text(encoding="utf-8").strip()


def placeholders(template: str) -> set[str]:
  """The `{field}` names a template uses."""
  return set(_PLACEHOLDER.findall(template))


def render(template: str, **fields) -> str:
  names = set(_PLACEHOLDER.findall(template))
  missing = [k for k in fields if k not in names]
  if missing:
    raise KeyError(f"Template has no placeholder for {missing}.")
  return _PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]) if m.group(1) in fields
                          else m.group(0), template)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """A template and its fields; `fit` names the fields that may be cut to meet a token limit."""

  template: str
  fields: Mapping[str, Any]
  fit: tuple[str, ...] = ()

  def text(self) -> str:
    return render(self.template, **self.fields)


def fit_prompt(prompt: Prompt, limit: int, count: Callable[[str], int],
               role: str = "this role") -> tuple[str, bool]:
  """(text, cut): the rendered prompt with its `fit` fields shortened from the end, longest
  first, until `count(text) <= limit`. Raises if the template and the other fields alone are
  over the limit (a setting to change, not something to truncate)."""
  fields = {k: str(v) for k, v in prompt.fields.items()}
  text = render(prompt.template, **fields)
  over = count(text) - limit
  cut = False
  while over > 0:
    name = max(prompt.fit, key=lambda k: len(fields[k]), default=None)
    if name is None or not fields[name]:
      raise ValueError(
          f"The prompt of {role} needs {count(text)} tokens without its inserted content "
          f"({', '.join(prompt.fit) or 'none may be cut'}), above its limit of {limit}: raise "
          f"the role's max_prompt_tokens (roles.<role>.max_prompt_tokens or "
          f"rollout.max_prompt_tokens).")
    value = fields[name].removesuffix(ELLIPSIS)
    chars_per_token = len(value) / max(count(value), 1)
    keep = max(0, len(value) - int((over + 1) * chars_per_token) - 1)
    fields[name] = value[:keep] + ELLIPSIS if keep else ""
    text, cut = render(prompt.template, **fields), True
    over = count(text) - limit
  return text, cut
