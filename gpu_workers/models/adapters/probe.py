"""The memory probe's search, apart from any device so that it can be tested alone."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["largest_fitting"]


def largest_fitting(fits: Callable[[int], bool], most: int) -> int:
    """The largest n in 1..most for which ``fits(n)`` is true, or 0 if not even 1 fits.

    Assumes that whatever fits, anything smaller fits too (memory grows with the batch).
    Doubles from 1 until a size does not fit, then bisects between the last size that
    fitted and the first that did not: about 2*log2(n) calls, each one trial batch.
    """
    if most < 1 or not fits(1):
        return 0
    good, bad = 1, most + 1
    while good < most:
        trial = min(good * 2, most)
        if not fits(trial):
            bad = trial
            break
        good = trial
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
