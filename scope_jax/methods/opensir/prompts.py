"""OpenSIR's two role prompts (the released templates): the teacher writes a new problem from a
reference problem, the student solves one. Each returns a `Prompt` whose problem a role may cut to
its prompt limit, never the template."""

from __future__ import annotations

from scope_jax import prompts


class Prompts:

  def teacher(self, reference: str) -> prompts.Prompt:
    return prompts.Prompt(prompts.load("opensir", "teacher"), {"problem": reference}, ("problem",))

  def student(self, problem: str) -> prompts.Prompt:
    return prompts.Prompt(prompts.load("opensir", "student"), {"problem": problem}, ("problem",))
