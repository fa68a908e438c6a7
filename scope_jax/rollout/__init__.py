"""Multi-turn rollouts that interleave generation with search-tool calls."""

from scope_jax.rollout.agent import (RolloutConfig, encode, plain_response, render_chat,
                                     run_rollout)
from scope_jax.rollout.parsers import Action, extract_tag, parse_action
from scope_jax.rollout.types import SearchTool, Span, ToolCall, Trajectory

__all__ = ["Action", "RolloutConfig", "SearchTool", "Span", "ToolCall", "Trajectory", "encode",
           "extract_tag", "parse_action", "render_chat", "run_rollout"]
