"""Uncertainty over tasks: bootstrap confidence intervals (percentile method, fixed seed:
deterministic) and paired differences."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 2000, seed: int = 0
                 ) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` and its ``level`` percentile-bootstrap interval,
    resampling the values (one per task) with replacement. NaNs for no values."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = sum(xs) / n
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(xs, k=n)) / n for _ in range(n_boot))
    alpha = (1 - level) / 2
    lo = means[max(0, math.floor(alpha * n_boot))]
    hi = means[min(n_boot - 1, math.ceil((1 - alpha) * n_boot) - 1)]
    return (mean, min(lo, mean), max(hi, mean))


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], level: float = 0.95, n_boot: int = 2000,
                          seed: int = 0) -> tuple[float, float, float]:
    """(mean of a - b, low, high) over paired values (the same tasks under two conditions)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    return bootstrap_ci([x - y for x, y in zip(a, b)], level, n_boot, seed)


def paired_gain(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[float, float, int]:
    """(mean of after - before, its standard error, n) over the keys both have (tasks scored at two
    points): pairing removes the spread between tasks, which dominates on a few tasks. The
    standard error is NaN for fewer than two pairs."""
    d = [after[k] - before[k] for k in before if k in after]
    if not d:
        return (math.nan, math.nan, 0)
    mean = sum(d) / len(d)
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    return (mean, se, len(d))
