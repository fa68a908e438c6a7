"""EMA teacher: ψ ← (1 − τ)ψ + τθ over params pytrees, on device, in the teacher's sharding."""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, donate_argnames=("teacher",))
def ema_update(teacher, student, tau):
  """Returns (1 − τ)·teacher + τ·student; the teacher's buffers are donated and reused."""
  def mix(t, s):
    out = (1.0 - tau) * t.astype(jnp.float32) + tau * s.astype(jnp.float32)
    return out.astype(t.dtype)
  return jax.tree.map(mix, teacher, student)
