"""The multi-turn agent loop: generate a turn → parse the action → one batched tool call → append.

Every row keeps its token ids exactly as sampled; observations (retrieved documents, corrective
messages) are appended as tokens with loss mask 0. Each row gets at most `max_turns` searches
(Search-R1: one generation per turn, an invalid action also uses a turn), then one final turn
with search disabled.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Sequence

import numpy as np
from absl import logging

from scope_jax.rollout import parsers
from scope_jax.rollout.datums import context_tokens
from scope_jax.rollout.types import SearchTool, Span, ToolCall, Trajectory
from scope_jax.sampling import SampleResult, SamplingSpec
from scope_jax.sampling.engine import Engine, Request, row_seed
from scope_jax.tokenizer import clean_text, encode_plain

INVALID_ACTION_XML = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n")
INVALID_ACTION_QWEN = (
    "\nMy previous action is invalid. If I want to search, I should call the search tool inside "
    "<tool_call> and </tool_call> as {\"name\": \"search\", \"arguments\": {\"query\": ...}}. If I "
    "want to give the final answer, I should put it between <answer> and </answer>. Let me try "
    "again.\n")
INVALID_ACTION_FUNCTION_CALLS = (
    "\nMy previous action is invalid. If I want to search, I should write "
    "<function_calls>search(query=\"my query\")</function_calls>. If I want to give the final "
    "output, I should put it between <answer> and </answer> or <task> and </task>. Let me try "
    "again.\n")
TRUNCATED = "...(truncated)"  # verl's mark after a tool response cut by characters
MAX_CHARS_PER_TOKEN = 64  # observations are cut to this many characters per token of budget
TOOL_ERROR = "The search tool failed for this query ({}). Try a different query or answer."


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  syntax: str = "xml"  # 'xml' (<search>), 'qwen' (<tool_call>) or 'function_calls' (OLMo-3)
  final_tags: tuple[str, ...] = ("answer",)  # elements that end a trajectory
  max_turns: int = 4  # searches allowed before the final, search-free turn
  max_turn_tokens: int = 512  # new tokens per generated turn
  max_obs_tokens: int = 500  # observation budget (documents are cut to this many tokens)
  # Character cap on a tool response before the token cap, as verl's `max_tool_response_length`
  # counts by default: longer text keeps its first max_obs_chars characters + "...(truncated)"
  # (0 = none).
  max_obs_chars: int = 0
  max_total_tokens: int = 4096  # prompt + response
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  # Thinking models (Qwen3): later turns see earlier turns with their <think> blocks removed, as
  # the chat template renders them; per-turn datums rebuild exactly this context.
  strip_think: bool = False
  # Observation wrappers; the qwen form closes the assistant turn and opens it again.
  obs_prefix_xml: str = "\n\n<information>"
  obs_suffix_xml: str = "</information>\n\n"
  obs_prefix_qwen: str = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
  obs_suffix_qwen: str = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

  def observation_wrappers(self) -> tuple[str, str]:
    if self.syntax in ("xml", "function_calls"):  # results inside <information>, as released
      return self.obs_prefix_xml, self.obs_suffix_xml
    return self.obs_prefix_qwen, self.obs_suffix_qwen

  def invalid_message(self) -> str:
    return {"xml": INVALID_ACTION_XML, "qwen": INVALID_ACTION_QWEN,
            "function_calls": INVALID_ACTION_FUNCTION_CALLS}[self.syntax]


@dataclasses.dataclass
class _Row:
  tokens: list[int]
  mask: list[int]
  logprobs: list[float]
  spans: list[Span]
  calls: list[ToolCall] = dataclasses.field(default_factory=list)
  searches: int = 0
  invalid: int = 0
  done: bool = False
  finish: str = ""
  final_tag: str | None = None
  answer: str | None = None
  context: list[int] = dataclasses.field(default_factory=list)  # what the next turn is fed

  def append(self, ids: Sequence[int], kind: str, text: str, logprobs=None,
             context_ids: Sequence[int] | None = None) -> None:
    """Records a piece; `context_ids` (default `ids`) is how it re-enters later turns."""
    self.context += [int(t) for t in (ids if context_ids is None else context_ids)]
    start = len(self.tokens)
    self.tokens += [int(t) for t in ids]
    generated = kind == "generated"
    self.mask += [1 if generated else 0] * len(ids)
    self.logprobs += (list(map(float, logprobs)) if generated else [0.0] * len(ids))
    self.spans.append(Span(start, len(self.tokens), kind, text))


def encode(tokenizer, text: str) -> list[int]:
  return list(tokenizer.encode(text, add_special_tokens=False))


def render_chat(tokenizer, messages: Sequence[dict], *, plain_contents: bool = False,
                **template_kwargs) -> list[int]:
  """Chat-template a conversation (ending with a generation prompt) into token ids. With
  `plain_contents` only the template makes control tokens: message contents (benchmark
  questions, documents) are encoded as plain text, so a literal `<|im_end|>` in them stays text.
  (Role prompts do not use it yet: the bundled demo model was warmed on their current ids.)"""
  messages = list(messages)
  render = lambda ms: tokenizer.apply_chat_template(ms, add_generation_prompt=True,
                                                    tokenize=False, **template_kwargs)
  text = render(messages)
  if not plain_contents:
    return encode(tokenizer, text)
  marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
  marked = render([dict(m, content=k) for m, k in zip(messages, marks)])
  pieces, ids = _split_marks(marked, marks), []
  contents = [m["content"] for m in messages]
  if pieces is None or "".join(p if j % 2 == 0 else contents[p] for j, p in
                               enumerate(pieces)) != text:
    return encode(tokenizer, text)  # the template rewrites contents: render it as it is
  for j, piece in enumerate(pieces):
    ids += encode(tokenizer, piece) if j % 2 == 0 else encode_plain(tokenizer, contents[piece])
  return ids


def plain_response(tokenizer, traj: Trajectory) -> str:
  """What a row generated (its turns, observations left out) as text without special tokens:
  the end-of-turn marker a turn ends with is not part of what it says, and an answer read from
  this text can never carry a control token into another prompt."""
  return "".join(tokenizer.decode([int(t) for t in traj.tokens[s.start:s.end]],
                                  skip_special_tokens=True) for s in traj.generated_turns())


def _split_marks(text: str, marks: Sequence[str]) -> list | None:
  """[template text, message index, template text, …] in order, or None unless each mark
  occurs exactly once."""
  out, rest = [], text
  for i, mark in enumerate(marks):
    if text.count(mark) != 1:
      return None
    head, _, rest = rest.partition(mark)
    out += [head, i]
  return out + [rest]


def run_rollout(sampler, tokenizer, prompts: Sequence[Sequence[int]], tool: SearchTool | None,
                config: RolloutConfig, *, num_samples: int = 1, seed: int = 0,
                progress: bool = False) -> list[Trajectory]:
  """Rolls out `num_samples` multi-turn trajectories per prompt (results prompt-major).

  sampler: a `sampling.Engine` (slots keep their cache across turns; rows advance on their own
    and tool calls overlap decoding) or a `sampling.Sampler` (turn by turn, each turn prefilled
    from scratch). Greedy rows come out identical either way.
  progress: show a bar of finished rows (useful for long multi-turn rollouts).
  """
  rows = []
  for p in prompts:
    for _ in range(num_samples):
      row = _Row([], [], [], [])
      row.append(p, "prompt", "")
      rows.append(row)
  from tqdm import tqdm
  bar = tqdm(total=len(rows), desc="rollout", unit="row", leave=False, disable=not progress)
  run = _on_engine if isinstance(sampler, Engine) else _turn_by_turn
  try:
    run(sampler, tokenizer, prompts, rows, tool, config, num_samples, seed, bar)
  finally:
    bar.close()
  for r in rows:
    if not r.done:
      r.done, r.finish = True, "max_turns"
  return [_trajectory(r, i // num_samples, i % num_samples, len(prompts[i // num_samples]))
          for i, r in enumerate(rows)]


def _turn_by_turn(sampler, tokenizer, prompts, rows, tool, config, num_samples, seed, bar):
  """All live rows generate a turn together, from their whole context; then one tool call."""
  for turn in range(config.max_turns + 1):
    active = [i for i, r in enumerate(rows) if not r.done]
    if not active:
      break
    search_allowed = turn < config.max_turns and tool is not None
    # Each row's own budget, as on the engine: all rows decode to the largest, and each is cut
    # to its own after (a row's tokens do not depend on how far the others go).
    budgets = {i: _turn_budget(rows[i], config) for i in active}
    budget = max(budgets.values())
    stop = _stops(config, search_allowed)
    if turn == 0:  # identical prompts: prefill once, fork num_samples ways
      results = sampler.generate(prompts, max_new_tokens=budget, stop=stop,
                                 num_samples=num_samples, seed=seed, **_sampling(config))
      results = [results[i] for i in active]
    else:
      results = sampler.generate([rows[i].context for i in active], max_new_tokens=budget,
                                 stop=stop, seed=seed + 7919 * turn, **_sampling(config))
    pending = []
    for i, res in zip(active, results):
      res = _cut(res, budgets[i], tokenizer)
      action = _absorb_turn(rows[i], res, turn, search_allowed, tool, tokenizer, config)
      if action is not None:
        pending.append((i, action))
    if pending:
      answers, error = _search(tool, [q for _, a in pending for q in a.queries])
      _observe(rows, pending, answers, error, turn, tokenizer, config)
    for i in active:
      _check_context(rows[i], config)
    bar.update(sum(rows[i].done for i in active))


def _on_engine(engine: Engine, tokenizer, prompts, rows, tool, config, num_samples, seed, bar):
  """Each row advances on its own: a finished turn is parsed at once; searches are batched into
  one tool call that runs on a worker thread while the other slots keep decoding; the
  observation is then prefilled into the row's slot, which kept its cache."""
  spec = SamplingSpec(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                      eos_ids=engine.eos_ids)
  turns = [0] * len(rows)

  def submit(i: int) -> None:
    search_allowed = turns[i] < config.max_turns and tool is not None
    engine.add(Request(("rollout", i), rows[i].context, _turn_budget(rows[i], config),
                       seed=row_seed(seed, i),
                       turn=turns[i], stop=tuple(_stops(config, search_allowed)), spec=spec))

  def settle(i: int) -> None:
    _check_context(rows[i], config)
    if rows[i].done:
      engine.release(("rollout", i))
      bar.update(1)
    else:
      submit(i)

  pending: list = []
  inflight = None  # (future, the rows' pending searches)
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
  try:
    for i in range(len(rows)):
      submit(i)
    while engine.busy() or pending or inflight is not None:
      for c in (engine.step() if engine.busy() else []):
        i = c.key[1]
        turn, search_allowed = turns[i], turns[i] < config.max_turns and tool is not None
        turns[i] += 1
        res = SampleResult(c.tokens, c.logprobs, c.finish_reason, i // num_samples, text=c.text,
                           stop=c.stop)
        action = _absorb_turn(rows[i], res, turn, search_allowed, tool, tokenizer, config)
        if action is not None:
          pending.append((i, action))
        else:
          settle(i)
      if pending and inflight is None:
        queries = [q for _, a in pending for q in a.queries]
        inflight, pending = (pool.submit(_search, tool, queries), pending), []
      if inflight is not None and (inflight[0].done() or not engine.busy()):
        (answers, error), searched = inflight[0].result(), inflight[1]
        inflight = None
        _observe(rows, searched, answers, error, None, tokenizer, config, turns=turns)
        for i, _ in searched:
          settle(i)
  finally:
    pool.shutdown(wait=True)
    engine.cancel()  # the cache stays: the next call may share its prefixes


def _turn_budget(row: _Row, config: RolloutConfig) -> int:
  """New tokens a row may generate this turn: the turn's limit, within the row's total."""
  return min(config.max_turn_tokens, max(config.max_total_tokens - len(row.context), 1))


def _cut(res: SampleResult, budget: int, tokenizer) -> SampleResult:
  """`res` as if generated with `budget` new tokens (unchanged when it fits)."""
  if len(res.tokens) <= budget:
    return res
  tokens = res.tokens[:budget]
  return dataclasses.replace(res, tokens=tokens, logprobs=res.logprobs[:budget],
                             finish_reason="length", stop=None,
                             text=tokenizer.decode(list(tokens), skip_special_tokens=False))


def _stops(config: RolloutConfig, search_allowed: bool) -> list[str]:
  search = [parsers.search_stop(config.syntax)] if search_allowed else []
  return [f"</{t}>" for t in config.final_tags] + search


def _sampling(config: RolloutConfig) -> dict:
  return dict(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)


def _absorb_turn(row: _Row, res, turn: int, search_allowed: bool, tool, tokenizer,
                 config: RolloutConfig) -> parsers.Action | None:
  """Appends a generated turn and acts on it; returns the search action the row now waits on."""
  row.append(res.tokens, "generated", res.text or "", res.logprobs,
             context_tokens(res.text or "", tokenizer) if config.strip_think else None)
  action = parsers.parse_action(res.text or "", syntax=config.syntax,
                                final_tags=config.final_tags, search_allowed=search_allowed)
  if res.finish_reason != "stop":
    row.done, row.finish = True, ("eos" if res.finish_reason == "eos" else "length")
    if row.finish == "eos" and turn == config.max_turns and tool is not None:
      row.finish = "max_turns"  # the search-free final turn ended without an answer
    if action.kind == "final":
      row.final_tag, row.answer, row.finish = action.tag, action.content, "final"
  elif action.kind == "final":
    row.done, row.finish, row.final_tag, row.answer = True, "final", action.tag, action.content
  elif action.kind == "search":
    return action
  else:
    row.invalid += 1
    if turn == config.max_turns:
      row.done, row.finish = True, "max_turns"
    else:
      msg = config.invalid_message()
      row.append(encode(tokenizer, msg), "observation", msg)
  return None


def _check_context(row: _Row, config: RolloutConfig) -> None:
  if not row.done and len(row.context) >= config.max_total_tokens:
    row.done, row.finish = True, "context"


def _search(tool, queries: list[str]) -> tuple[list[str], str | None]:
  """One batched tool call; a failure becomes an error text, never an exception."""
  try:
    answers = list(tool(queries))
    if len(answers) != len(queries):
      raise RuntimeError(f"tool returned {len(answers)} results for {len(queries)} queries")
    odd = [type(a).__name__ for a in answers if not isinstance(a, str)]
    if odd:
      raise TypeError(f"tool returned {odd[0]} where text was expected")
    return [clean_text(a) for a in answers], None
  except Exception as e:  # a tool failure must never end the rollout
    logging.warning("Search tool failed on %d queries: %s", len(queries), e)
    return [""] * len(queries), f"{type(e).__name__}: {e}"[:200]


def _observe(rows, pending, answers, error, turn, tokenizer, config: RolloutConfig, *,
             turns=None) -> None:
  """Appends each searching row's observation (the documents, or the tool's error)."""
  prefix, suffix = config.observation_wrappers()
  prefix_ids, suffix_ids = encode(tokenizer, prefix), encode(tokenizer, suffix)
  pos = 0
  for i, action in pending:
    row = rows[i]
    parts = answers[pos:pos + len(action.queries)]
    pos += len(action.queries)
    body = TOOL_ERROR.format(error) if error else "\n".join(p.strip() for p in parts)
    row.calls.append(ToolCall(turn if turns is None else turns[i] - 1, list(action.queries), body,
                              error))
    row.searches += error is None
    # Cut by characters first (no token is that long), so a huge document costs no more than
    # the part that can be shown; then to the token budget, with special-token parsing off.
    if 0 < config.max_obs_chars < len(body):
      body = body[:config.max_obs_chars] + TRUNCATED
    body = body[:config.max_obs_tokens * MAX_CHARS_PER_TOKEN]
    body_ids = encode_plain(tokenizer, body)[:config.max_obs_tokens]
    ids = prefix_ids + body_ids + suffix_ids
    row.append(ids, "observation", tokenizer.decode(ids, skip_special_tokens=False))


def _trajectory(row: _Row, prompt_index: int, sample_index: int, prompt_len: int) -> Trajectory:
  return Trajectory(
      tokens=np.asarray(row.tokens, np.int32), loss_mask=np.asarray(row.mask, np.int32),
      logprobs=np.asarray(row.logprobs, np.float32), prompt_len=prompt_len, spans=row.spans,
      tool_calls=row.calls, final_tag=row.final_tag, answer=row.answer, finish_reason=row.finish,
      num_invalid=row.invalid, prompt_index=prompt_index, sample_index=sample_index)
