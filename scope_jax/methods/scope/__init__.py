"""SCOPE: a Challenger and a Solver co-evolve from one base model; a frozen Judge grades rubrics."""
