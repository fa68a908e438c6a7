"""Experiment configs: one module per method, `get_config(preset)`; see each module's docstring."""
