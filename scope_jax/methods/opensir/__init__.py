"""OpenSIR: a teacher poses math problems and a student solves them, rewarded by solve rate and novelty."""
