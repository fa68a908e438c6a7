"""Action parsing for one generated turn. Model output is untrusted: regexes and bounded JSON only.

Three search syntaxes:
  'xml':  <search> query </search>                                   (Search-R1, Qwen2.5 prompts)
  'qwen': <tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>   (Qwen3 native),
          arguments may also be {"query_list": [...]}.
  'function_calls': <function_calls>search(query="...")</function_calls>     (OLMo-3's calls, as
          a released `function_calls_xml` format writes them; answers stay XML elements).
A turn ends at the first closing tag, so the action is the element that tag closes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

MAX_QUERY_CHARS = 1000
MAX_QUERIES = 8
MAX_JSON_CHARS = 20_000
SYNTAXES = ("xml", "qwen", "function_calls")
MAX_CALL_CHARS = 4 * MAX_QUERY_CHARS  # a longer function call is invalid, not parsed
_SEARCH_CALL = re.compile(r"\s*search\s*\(\s*query\s*=\s*([\"'])(.+?)\1\s*\)\s*", re.S)


@dataclasses.dataclass(frozen=True)
class Action:
  kind: str  # 'search' | 'final' | 'invalid' | 'none'
  queries: tuple[str, ...] = ()
  tag: str | None = None  # final element name, e.g. 'answer'
  content: str | None = None  # final element content (stripped)
  error: str | None = None


def search_stop(syntax: str) -> str:
  return {"xml": "</search>", "qwen": "</tool_call>", "function_calls": "</function_calls>"}[syntax]


def _last_element(text: str, tag: str) -> str | None:
  """Content of the last complete <tag>...</tag> (innermost open before the last close)."""
  close = text.rfind(f"</{tag}>")
  if close < 0:
    return None
  open_ = text.rfind(f"<{tag}>", 0, close)
  if open_ < 0:
    return None
  return text[open_ + len(tag) + 2:close]


def _tool_call_queries(body: str) -> tuple[tuple[str, ...], str | None]:
  if len(body) > MAX_JSON_CHARS:
    return (), "tool call too long"
  try:
    call = json.loads(body.strip())
  except (ValueError, RecursionError):
    return (), "tool call is not valid JSON"
  if not isinstance(call, dict) or call.get("name") not in ("search", "retrieve"):
    return (), "tool call must be {\"name\": \"search\", \"arguments\": {...}}"
  args = call.get("arguments")
  if isinstance(args, str):  # some models double-encode the arguments
    try:
      args = json.loads(args) if len(args) <= MAX_JSON_CHARS else None
    except (ValueError, RecursionError):
      args = None
  if not isinstance(args, dict):
    return (), "tool call arguments must be an object"
  if isinstance(args.get("query"), str):
    queries = [args["query"]]
  elif isinstance(args.get("query_list"), list) and all(isinstance(q, str)
                                                        for q in args["query_list"]):
    queries = args["query_list"]
  else:
    return (), "tool call needs a string 'query' or a list 'query_list'"
  return _clean_queries(queries)


def _function_call_queries(body: str) -> tuple[tuple[str, ...], str | None]:
  """`search(query="...")` (or single quotes); a double-quoted query is read as a JSON string
  when it is one (escaped quotes inside), else taken as written."""
  if len(body) > MAX_CALL_CHARS:
    return (), "function call too long"
  m = _SEARCH_CALL.fullmatch(body)
  if m is None:
    return (), 'function call must be search(query="...")'
  quote, query = m.groups()
  if quote == '"':
    try:
      decoded = json.loads(f'"{query}"')
      query = decoded if isinstance(decoded, str) else query
    except ValueError:
      pass
  return _clean_queries([query])


def _clean_queries(queries: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
  queries = [q.strip() for q in queries if q.strip()]
  if not queries:
    return (), "empty search query"
  if len(queries) > MAX_QUERIES:
    return (), f"at most {MAX_QUERIES} queries per call"
  return tuple(q[:MAX_QUERY_CHARS] for q in queries), None


def parse_action(text: str, *, syntax: str = "xml", final_tags: Sequence[str] = ("answer",),
                 search_allowed: bool = True) -> Action:
  """Parses what a turn asked for; never raises on any text."""
  if syntax not in SYNTAXES:
    raise ValueError(f"Unknown search syntax {syntax!r}; valid: {', '.join(SYNTAXES)}.")
  stop = search_stop(syntax)
  ends = {tag: text.rfind(f"</{tag}>") for tag in final_tags}
  search_end = text.rfind(stop)
  last_final = max(ends.values(), default=-1)
  if search_end > last_final:
    if not search_allowed:
      return Action("invalid", error="search is not allowed in the final turn")
    if syntax == "xml":
      body = _last_element(text, "search")
      if body is None:
        return Action("invalid", error="</search> without <search>")
      queries, err = _clean_queries([body])
    elif syntax == "qwen":
      body = _last_element(text, "tool_call")
      if body is None:
        return Action("invalid", error="</tool_call> without <tool_call>")
      queries, err = _tool_call_queries(body)
    else:
      body = _last_element(text, "function_calls")
      if body is None:
        return Action("invalid", error="</function_calls> without <function_calls>")
      queries, err = _function_call_queries(body)
    return Action("invalid", error=err) if err else Action("search", queries=queries)
  if last_final >= 0:
    tag = max(ends, key=ends.get)
    content = _last_element(text, tag)
    if content is None:
      return Action("invalid", error=f"</{tag}> without <{tag}>")
    return Action("final", tag=tag, content=content.strip())
  return Action("none")


def extract_tag(text: str, tag: str) -> str | None:
  """Content of the last complete <tag>...</tag> in text, stripped (None if absent)."""
  content = _last_element(text, tag)
  return None if content is None else content.strip()
