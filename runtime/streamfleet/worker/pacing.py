"""The jitter every periodic loop of the worker shares: a fleet started at once would otherwise
keep firing its reconciles, rebalances and retries in step, and load DynamoDB in bursts."""

from __future__ import annotations

import random


def jittered(seconds: float) -> float:
    """``seconds`` give or take 20 %, so a fleet's loops drift apart instead of firing together."""
    return seconds * random.uniform(0.8, 1.2)
