"""Rewards: what a reward is called on and what scoring returns (`batch`)."""
