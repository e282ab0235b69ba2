"""How sure a median ratio over rounds is: the interval ``scale.py`` and ``e2e.py`` report beside it.

Both scripts interleave the setups in rounds and take, in each round, the
ratio of connlist's figure to bare's; the report is the median of those
ratios.  A round's noise on a shared machine moves them far more than the
difference between the setups, so each median comes with an interval that
holds the median of the ratios' distribution with 95% confidence, whatever
that distribution is: where it holds the target, the rounds cannot tell.
"""

from __future__ import annotations

import itertools
import math

__all__ = ["CONFIDENCE", "FEWEST_ROUNDS", "median_interval", "tells", "worded"]

# How sure the interval of a median ratio is.
CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """An interval that holds the median of the ratios' distribution, with ``confidence``; None: too few.

    Whatever that distribution is, the k-th smallest and the k-th largest of
    n values drawn from it enclose its median unless k or fewer fall on one
    side, which happens with probability 2 P(B < k), B binomial (n, 1/2).  k
    is the largest whose interval keeps ``confidence``: at 95%, 6 values are
    the fewest (the smallest and the largest), 21 give the 6th of each end.
    """
    ordered = sorted(values)
    n = len(ordered)
    k = 0
    below = 0  # 2**n P(B < k)
    while k < n // 2:
        below_next = below + math.comb(n, k)
        if 2 * below_next > (1 - confidence) * 2**n:
            break
        below = below_next
        k += 1
    return None if k == 0 else (ordered[k - 1], ordered[n - k])


def tells(interval: tuple[float, float] | None, ceiling: float) -> bool:
    """Whether the rounds decide "at most ``ceiling``", either way: the interval leaves it out.

    No interval (too few rounds): the median alone decides.
    """
    return interval is None or not interval[0] <= ceiling < interval[1]


# The fewest rounds that give an interval at ``CONFIDENCE`` (6 at 95%).
FEWEST_ROUNDS = next(n for n in itertools.count(1) if median_interval([0.0] * n) is not None)


def worded(interval: tuple[float, float], digits: int, told: bool = True) -> str:
    """The interval as the reports put it, in parentheses; ``told`` False: the rounds cannot tell."""
    low, high = interval
    end = ")" if told else ": the rounds cannot tell)"
    return f"({CONFIDENCE:.0%} interval of the median {low:.{digits}f}..{high:.{digits}f}{end}"
