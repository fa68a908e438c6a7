"""Scripted policies for method tests: each answers every role of a method by reading its prompt."""

import json
import re
import zlib

import numpy as np

from scope_jax.sampling import SampleResult
from scope_jax.sampling.stops import find_stop
from scope_jax.world import entities as world_entities


def search_call(query: str, prompt: str) -> str:
  """A search as a model that follows `prompt` writes it: Qwen's <tool_call> with the tool name
  and argument the prompt describes (ASL's `retrieve`, π-Play's `query_list`), OLMo-3's
  <function_calls>, else <search>."""
  if "<function_calls>" in prompt:
    return f"<function_calls>search(query={json.dumps(query)})</function_calls>"
  if "<tool_call>" not in prompt:
    return f"<search>{query}</search>"
  name = "retrieve" if "Name:retrieve" in prompt else "search"
  args = {"query_list": [query]} if "query_list" in prompt else {"query": query}
  return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def last_query(response: str) -> str | None:
  """The query of the last search call in either syntax."""
  calls = re.findall(r"<search>(.*?)</search>|<tool_call>\s*(\{.*?\})\s*</tool_call>|"
                     r"<function_calls>search\(query=(\".*?\")\)</function_calls>", response, re.S)
  if not calls:
    return None
  xml, js, fc = calls[-1]
  if xml:
    return xml.strip()
  if fc:
    return json.loads(fc)
  args = json.loads(js)["arguments"]
  return args["query_list"][0] if "query_list" in args else args["query"]


def play_all_roles(rt, sampler) -> None:
  """Every role (and every trained policy's sampler) of a runtime plays through `sampler`."""
  for role in rt.roles.values():
    role.sampler = sampler
  for policy in rt.policies.values():
    policy.sampler = sampler


class ScriptedSampler:
  """The sampler interface over `_answer(prompt text, rng) -> reply`; replies end with EOS (or
  at a stop string), with a fixed log-prob per token. Deterministic given the seed."""

  logprob = -2.0

  def __init__(self, tokenizer):
    self.tok = tokenizer
    self.calls = 0

  def update_params(self, params):
    del params

  def _answer(self, text, rng):
    raise NotImplementedError

  def generate(self, prompts, *, max_new_tokens, num_samples=1, seed=0, stop=(), **_):
    rng = np.random.default_rng(seed)
    self.calls += 1
    out = []
    for i, p in enumerate(prompts):
      text = self.tok.decode(p)
      for _ in range(num_samples):
        ids = self.tok.encode(self._answer(text, rng))
        match = find_stop(ids, stop, self.tok.decode) if stop else None
        if match:
          ids, reason = ids[:match.num_tokens], "stop"
        else:
          ids, reason = ids[:max_new_tokens - 1] + [self.tok.eos_token_id], "eos"
        out.append(SampleResult(np.asarray(ids, np.int32),
                                np.full(len(ids), self.logprob, np.float32), reason, i,
                                text=self.tok.decode(ids)))
    return out


class ScriptedSpellSampler(ScriptedSampler):
  """Questioner: a valid proposal about the first document; responder: right or wrong by a
  per-row coin; verifier: a noisy comparison."""

  def _answer(self, text, rng):
    if "propose" in text or "generate a multiple choice" in text or "ONE new" in text \
        or re.search(r"Write one (new, harder )?(multiple-choice )?question", text):
      title = re.search(r"<text>\n(.*?)\n", text).group(1)
      if '"options"' in text:
        letter = re.search(r"The correct answer must be option ([A-D])", text).group(1)
        return ('Reasoning... {"question": "Which one?", "options": {"A": "w", "B": "x", '
                f'"C": "y", "D": "z"}}, "answer": "{letter}"}}')
      if "numerical answer" in text or "answer is a number" in text:
        return '{"question": "How many?", "answer": "42"}'
      return f'{{"question": "Which topic is first?", "answer": "{title}"}}'
    if "You are an expert in verifying" in text or "Do the two answers mean the same" in text:
      a1 = re.search(r"Answer 1: (.*)", text).group(1)
      a2 = re.search(r"Answer 2: (.*)", text).group(1)
      same = a1.strip().lower() in a2.strip().lower()
      if rng.random() < 0.2:
        same = not same
      return "Decision: " + ("[[YES]]" if same else "[[NO]]")
    if "<text>\nEmpty\n</text>" in text:
      return "The correct answer is unknown."
    gold = re.search(r"<text>\n(.*?)\n", text).group(1)
    right = rng.random() < 0.5
    if "Choices:" in text or "\n(A) " in text:
      return "The correct answer is (" + ("ABCD"[rng.integers(4)]) + ")."
    if "numeric reasoning" in text or "the answer is (number)" in text:
      return "Therefore, the answer is " + ("42" if right else "7") + "."
    return "The correct answer is " + (gold if right else "something else") + "."


class ScriptedScopeSampler(ScriptedSampler):
  """Plays every SCOPE role by reading its prompt (real searches go to the real tool):

  Challenger: searches the document title, then the first title of each result, until it made
  the required number of searches; then a task naming the document. Solver: searches the task,
  then answers with the first retrieved title (right or wrong by a per-row coin). Judge: gates
  pass unless `gate_fail` is in the task; rubric of three criteria; a grader that checks the
  criterion's entity against the answer. `garbage` makes the Judge's outputs unparseable;
  `untagged` is the share of Challenger samples that leave out the <task> tags (by a coin).
  """

  logprob = -1.5

  def __init__(self, tokenizer, garbage: bool = False, untagged: float = 0.0):
    super().__init__(tokenizer)
    self.garbage, self.untagged = garbage, untagged

  def _answer(self, text, rng):
    prompt, _, response = text.partition("<|im_start|>assistant\n")
    if "You are the Challenger" in prompt:
      title = re.search(r"<document>\nTitle: (.*)\n", prompt).group(1)
      need = int(re.search(r"Use exactly (\d+) search turn", prompt).group(1))
      found = re.findall(r"Doc 1\(Title: (.*?)\)", response)
      if len(found) < need:
        query = found[-1] if found else title
        return f"<think>Look up {query}.</think>\n{search_call(query, prompt)}"
      task = f"Explain how {title} relates to {found[-1]}."
      if "<question>" in prompt:  # the form the prompt asks for (scope.task_form)
        task = f"<question>{task}</question>"
      if self.untagged and rng.random() < self.untagged:
        return f"<think>Enough.</think>\n{task}"
      return f"<think>Enough.</think>\n<task>\n{task}\n</task>"
    if "Complete the task below" in prompt or "Complete the task." in prompt:
      found = re.findall(r"Doc 1\(Title: (.*?)\)", response)
      if not found:
        question = re.search(r"Task: (.*)", prompt).group(1)
        return f"<think>Search first.</think>\n{search_call(question, prompt)}"
      name = found[0] if rng.random() < 0.6 else "nothing relevant"
      return f"<think>Answer.</think>\n<answer>It is about {name}.</answer>"
    if self.garbage:
      return "I cannot decide."
    if re.search(r"Check:? (entity identifiability|source relevance)", prompt):
      return "<think>ok</think>\n<score>" + ("0" if "gate_fail" in prompt else "1") + "</score>"
    if "You are writing the grading rubric" in prompt or "Write the grading rubric" in prompt:
      title = re.search(r"<document>\nTitle: (.*)\n", prompt).group(1)
      return (f"<rubric>\n1. [critical] Identifies {title}.\n2. [important] States what "
              f"{title} is known for.\n3. [bonus] Mentions a related topic clearly.\n</rubric>")
    if "You are grading a response" in prompt or "Grade the response against" in prompt:
      criterion = re.search(r"Criterion:\s*(.*)\n", prompt).group(1)
      response_text = prompt.split("Response:", 1)[1]
      hit = any(w in response_text for w in criterion.split()[1:3] if len(w) > 3)
      return "<think>checked</think>\n<score>" + str(int(hit)) + "</score>"
    raise AssertionError(f"unknown role for prompt: {prompt[:200]!r}")


class ScriptedOpenSirSampler(ScriptedSampler):
  """Teacher: 'What is a + b?' with concepts (1 row in 5 without them, so not legal); student:
  the right sum in the answer sentence 3 times in 5, else a near miss; any other problem (a
  held-out word problem) gets its first number as the answer."""

  def _answer(self, text, rng):
    if "create a math problem" in text:
      a, b = (int(x) for x in rng.integers(1, 9, size=2))
      concepts = "" if rng.random() < 0.2 else "<concepts>integer addition</concepts>"
      return f"<think>Addition.</think>\n<problem>What is {a} + {b}?</problem>\n{concepts}"
    sums = re.findall(r"What is (\d+) \+ (\d+)\?", text)
    if not sums:
      first = re.findall(r"\d+", text.rsplit("solves the problem.", 1)[-1])[0]
      return f"Therefore, the final answer is: $\\boxed{{{first}}}$"
    a, b = (int(x) for x in sums[-1])
    answer = a + b if rng.random() < 0.6 else a + b + int(rng.integers(1, 3))
    return f"{a} + {b} = {answer}.\nTherefore, the final answer is: $\\boxed{{{answer}}}$"


class ScriptedPiPlaySampler(ScriptedSampler):
  """Plays π-Play's roles by reading their prompts (compact or paper, either syntax; real
  searches):

  Examiner: searches the document title until it made n − 1 searches, then asks for the fifth
  word of the last page it read (the document itself for one hop); every `malformed_every`-th
  question (by a hash of its page, so a resumed run writes the same) leaves out the <question>
  (0: none). Student: searches the page named in
  the question, then answers its fifth word 3 times in 5 (else 'unknown'). Teacher: searches the
  same way, then answers with the <answer> it was shown in the construction path 9 times in 10.
  """

  logprob = -1.0
  EXAMINER = re.compile(r'n = (\d+)(?:\. Document:| hops starting from the following source '
                        r'document:) \(Title: "(.*?)"\) (.*)')

  def __init__(self, tokenizer, malformed_every: int = 4):
    super().__init__(tokenizer)
    self.malformed_every = malformed_every

  @staticmethod
  def fifth_word(text):
    return re.sub(r"[^\w]", "", text.split()[4])

  def _search_or(self, prompt, response):
    found = re.findall(r"Doc 1\(Title: .*?\) (.*)", response)
    if found:
      return found[0]
    pages = re.findall(r"Question: In (.*?), which word", prompt)
    page = pages[-1] if pages else re.findall(r"Question: (.*)", prompt)[-1]  # a held-out one
    return f"<think>Search.</think>\n{search_call(f' {page} ', prompt)}"

  def _answer(self, text, rng):
    # The teacher's privileged path quotes the examiner's turns, chat markers included: its
    # response starts at the first assistant header after the path's closing rule.
    cut = text.rfind("=" * 5) + 1 if "given privileged information" in text \
        or "You are the teacher" in text else 0
    head, _, response = text[cut:].partition("<|im_start|>assistant\n")
    prompt = text[:cut] + head
    if "You are the examiner" in prompt or "You are an expert in question generation" in prompt:
      hops, title, body = self.EXAMINER.findall(prompt)[-1]
      found = re.findall(r"Doc 1\(Title: (.*?)\) (.*)", response)
      if len(found) < int(hops) - 1:
        return f"<think>Hop {len(found) + 1}.</think>\n{search_call(f' {title} ', prompt)}"
      page, body = found[-1] if found else (title, body)
      question = f"<question>In {page}, which word comes fifth?</question>"
      if self.malformed_every and zlib.crc32(page.encode()) % self.malformed_every == 0:
        question = ""
      return f"<think>Ask.</think>\n{question}<answer>{self.fifth_word(body)}</answer>"
    teacher = "You are the teacher" in prompt or "given privileged information" in prompt
    if teacher or "Answer the question." in prompt or "Answer the given question." in prompt:
      page = self._search_or(prompt, response)
      if page.startswith("<think>"):
        return page
      if teacher:
        shown = re.findall(r"<answer>(.*?)</answer>", re.split(r"={5,}", prompt)[1])
        answer = shown[-1] if shown and rng.random() < 0.9 else "unknown"
      else:
        answer = self.fifth_word(page) if rng.random() < 0.6 else "unknown"
      return f"<think>Answer.</think>\n<answer>{answer}</answer>"
    raise AssertionError(f"unknown role for prompt: {prompt[:200]!r}")


class ScriptedAslSampler(ScriptedSampler):
  """Plays ASL's three roles (compact or paper prompts, XML search; searches go to the real tool).

  PG: searches its topic (or the previous answer), then asks which entity that search returns
  first, answered with the first retrieved title; where that title is the topic itself (the
  world's topics name their own pages) it asks which closed-class fact the page states instead.
  PM: makes the same search and answers with the first title (or the page's fact) 3 times in 5,
  else 'nothing'. GRM: makes the same search and says correct iff the student's answer is that
  title (or fact), flipped 1 time in 10. `pg_mode` makes the PG malformed
  ('no_question', 'empty_answer', 'answer_in_question'); `grm_garbage` makes every GRM output
  unparseable.
  """

  logprob = -1.2

  def __init__(self, tokenizer, pg_mode: str = "good", grm_garbage: bool = False,
               grm_flip: float = 0.1):
    super().__init__(tokenizer)
    self.pg_mode, self.grm_garbage, self.grm_flip = pg_mode, grm_garbage, grm_flip

  @staticmethod
  def _query(question):
    found = re.search(r"does the search for (.*?) return first\?|Which fact does the page of "
                      r"(.*?) state\?", question)
    return next(g for g in found.groups() if g) if found else question

  @staticmethod
  def _fact(response: str) -> str:
    """The closed-class fact (profession, industry, language) the first retrieved page states."""
    page = response.split("Doc 1(Title: ", 1)[1].split("\n", 1)[0]
    return next((m for members in world_entities.CLASSES.values() for m in members
                 if re.search(rf"\b{re.escape(m)}\b", page)), "nothing")

  def _truth(self, question: str, response: str, first: list[str]) -> str:
    return self._fact(response) if question.startswith("Which fact does the page of") \
        else first[0]

  def _answer(self, text, rng):
    prompt, _, response = text.partition("<|im_start|>assistant\n")
    first = re.findall(r"Doc 1\(Title: (.*?)\)", response)
    if "Write a question about" in prompt or "Please generate a question about" in prompt \
        or "Students answer" in prompt or "I asked a question to my students:" in prompt:
      if not first:
        topic = re.search(r"(?:Write a question about|Please generate a question about) (.*?)"
                          r"(?: with one entity|\.\n)", prompt)
        query = topic.group(1) if topic else re.search(
            r"\(answer: (.*?)\)\.|The true answer to this question is:\n(.*)\n", prompt)
        if not isinstance(query, str):
          query = next(g for g in query.groups() if g)
        return search_call(query, prompt)
      query = last_query(response)
      question = f"Which entity does the search for {query} return first?"
      if first[0] == query and self._fact(response) != "nothing":
        question = f"Which fact does the page of {query} state?"
        first = [self._fact(response)]
      if self.pg_mode == "no_question":
        return f"<answer>{first[0]}</answer>"
      if self.pg_mode == "empty_answer":
        return f"<question>{question}</question>\n<answer> </answer>"
      if self.pg_mode == "answer_in_question":
        return f"<question>Is it {first[0]}?</question>\n<answer>{first[0]}</answer>"
      return f"<question>{question}</question>\n<answer>{first[0]}</answer>"
    prompt = prompt.replace("<|im_end|>", "")
    question = re.search(r"Question: (.*)\n|to my student:\n(.*)\n", prompt)
    question = next(g for g in question.groups() if g)
    if not first:
      return search_call(self._query(question), prompt)
    if "Verify the student's answer" in prompt or "verify the correctness" in prompt:
      if self.grm_garbage:
        return "<answer>I cannot decide.</answer>"
      student = re.search(r"Student's answer: (.*)|My student's answer is:\n(.*)\n", prompt)
      student = next(g for g in student.groups() if g)
      truth = self._truth(question, response, first)
      right = (student.strip() == truth) != (rng.random() < self.grm_flip)
      return "<answer>conclusion: " + ("correct" if right else "wrong") + "</answer>"
    name = self._truth(question, response, first) if rng.random() < 0.6 else "nothing"
    return f"<answer>{name}</answer>"
