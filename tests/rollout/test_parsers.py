"""Action parsers: hand-written cases, and no exception on arbitrary text (hypothesis)."""

from hypothesis import given, settings, strategies as st

from scope_jax.rollout import extract_tag, parse_action

TAGS = ["<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<task>",
        "</task>", "<function_calls>", "</function_calls>", "search(", "query=", ")", "'", "{", "}", '"query"', '"query_list"', '"name": "search"', '"arguments":', "[", "]",
        ":", ",", '"', "\\", "\x00", "é"]


def test_xml_cases():
  assert parse_action("<think>x</think><search> a b </search>").queries == ("a b",)
  a = parse_action("<answer> Paris </answer>")
  assert (a.kind, a.tag, a.content) == ("final", "answer", "Paris")
  assert parse_action("<search></search>").kind == "invalid"
  assert parse_action("plain text").kind == "none"
  assert parse_action("<search>q</search>", search_allowed=False).kind == "invalid"
  a = parse_action("<task><question>Q</question></task>", final_tags=("answer", "task"))
  assert (a.tag, a.content) == ("task", "<question>Q</question>")


def test_qwen_cases():
  q = '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
  assert parse_action(q, syntax="qwen").queries == ("x",)
  q = '<tool_call>{"name": "search", "arguments": {"query_list": ["x", " y "]}}</tool_call>'
  assert parse_action(q, syntax="qwen").queries == ("x", "y")
  q = '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"z\\"}"}</tool_call>'
  assert parse_action(q, syntax="qwen").queries == ("z",)
  for bad in ['<tool_call>[1]</tool_call>', '<tool_call>{"name": "rm"}</tool_call>',
              '<tool_call>{"name": "search", "arguments": {"query": 3}}</tool_call>',
              '<tool_call>' + "[" * 5000 + '</tool_call>']:
    assert parse_action(bad, syntax="qwen").kind == "invalid", bad


def test_function_calls_cases():
  """OLMo-3's calls as SCOPE's released parser reads them: search(query="…") in either quote."""
  fc = lambda body: parse_action(f"<think>x</think><function_calls>{body}</function_calls>",
                                 syntax="function_calls", final_tags=("answer", "task"))
  assert fc('search(query="Eiffel Tower")').queries == ("Eiffel Tower",)
  assert fc(" search ( query = 'a b' ) ").queries == ("a b",)
  assert fc('search(query="say \\"hi\\"")').queries == ('say "hi"',)  # a JSON-escaped quote
  for bad in ['search()', 'task(task_prompt="x")', 'search(query="")', 'search(q="x")',
              'search(query="' + "x" * 5000 + '")', 'search(query="x")) + rm']:
    assert fc(bad).kind == "invalid", bad
  a = parse_action('<function_calls>search(query="x")</function_calls> then <task>T</task>',
                   syntax="function_calls", final_tags=("task",))
  assert (a.kind, a.content) == ("final", "T")  # the last element decides, as in every syntax
  assert parse_action("<search>x</search>", syntax="function_calls").kind == "none"


def test_extract_tag():
  assert extract_tag("<q>a</q> <q> b </q>", "q") == "b"
  assert extract_tag("<q>a", "q") is None


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=8)), max_size=30),
       st.sampled_from(["xml", "qwen", "function_calls"]), st.booleans())
def test_parsers_never_raise(parts, syntax, allowed):
  text = "".join(parts)
  a = parse_action(text, syntax=syntax, final_tags=("answer", "task"), search_allowed=allowed)
  assert a.kind in ("search", "final", "invalid", "none")
  if a.kind == "search":
    assert a.queries and all(isinstance(q, str) and q for q in a.queries)
  extract_tag(text, "answer")
