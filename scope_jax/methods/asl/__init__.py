"""ASL: one policy as prompt generator, generative reward model and policy model, in phases."""
