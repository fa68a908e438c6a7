"""Stop strings over sampled token ids: find where the first closing tag ends, exactly.

Token ids are never re-tokenised: a row stops at the first token whose decoded prefix contains a
stop string, and the text is cut right after that string. Tags may span several tokens; only a
window of recent tokens is decoded per check, so checking is linear in the generated length.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


@dataclasses.dataclass(frozen=True)
class StopMatch:
  num_tokens: int  # keep tokens[:num_tokens]; the last one completes the stop string
  text: str  # decoded text of the kept tokens, cut right after the stop string
  stop: str  # which stop string matched


def check(stops: Sequence[str]) -> None:
  """Stop strings a row can meet: an empty one is in every text, and would end every row after
  its first token."""
  if stops is None:
    return
  if isinstance(stops, str) or any(not isinstance(s, str) or not s for s in stops):
    raise ValueError(f"Stop strings must be a list of non-empty strings; got {stops!r}.")


def find_stop(tokens: Sequence[int], stops: Sequence[str], decode: Decode, start: int = 0,
              window: int = 32) -> StopMatch | None:
  """Earliest stop string completed at or after token `start` (tokens before it were checked)."""
  if not stops or len(tokens) <= start:
    return None
  lo = max(0, start - window)
  tail = decode(tokens[lo:])
  if not any(s in tail for s in stops):
    return None
  # The stop completes at the first k whose decoded prefix holds a stop string.
  for k in range(max(start, 1), len(tokens) + 1):
    piece = decode(tokens[lo:k])
    if any(s in piece for s in stops):
      text = decode(tokens[:k])
      cut, stop = min((text.find(s) + len(s), s) for s in stops if s in text)
      return StopMatch(num_tokens=k, text=text[:cut], stop=stop)
  return None
