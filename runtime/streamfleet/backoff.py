"""Full-jitter exponential backoff, for every retry loop of the runtime and the client.

Many workers, Lambdas or clients fail together when what they call fails; a random pause
anywhere from zero to the exponential bound spreads their retries apart, where a fixed or only
slightly jittered one would bring them back together.
"""

from __future__ import annotations

import random


def full_jitter(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """``random(0, min(cap, base * 2**attempt))`` seconds, drawn from ``rng`` if given.

    ``attempt`` may grow without bound (a stream that fails for days): past 64 doublings every
    base is at its cap, so the power stops there instead of overflowing a float.
    """
    return (rng or random).uniform(0.0, min(cap, base * (2 ** min(attempt, 64))))
