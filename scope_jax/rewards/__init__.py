"""Rewards: plain Python on host data, robust to malformed model output."""
