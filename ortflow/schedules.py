"""Learning-rate schedules as plain functions of the number of samples seen (scikit-learn's definitions)."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "invscaling", "optimal")


def learning_rate_at(
    schedule: str, eta0: float, samples_seen: int, power_t: float = 0.25, alpha: float = 1e-4
) -> float:
    """Learning rate after ``samples_seen`` samples.

    ``constant``: eta0. ``invscaling``: eta0 / (samples_seen + 1) ** power_t (scikit-learn MLP's SGD).
    ``optimal``: 1 / (alpha * (t0 + samples_seen)) with t0 = 1 / (eta_init * alpha) and eta_init = 1 / sqrt(sqrt(alpha)),
    exactly scikit-learn's SGDRegressor/SGDClassifier sequence (its heuristic divides by max(1, dloss(-typw, 1)),
    which is 1 for its losses since that signed derivative is negative): 10.0 at the first sample for alpha=1e-4.
    """
    if schedule == "constant":
        return eta0
    if schedule == "invscaling":
        return eta0 / (samples_seen + 1) ** power_t
    if schedule == "optimal":
        eta_init = math.sqrt(1.0 / math.sqrt(alpha))  # typw / max(1, dloss(-typw, 1)) with dloss(-typw, 1) < 0
        t0 = 1.0 / (eta_init * alpha)
        return 1.0 / (alpha * (t0 + samples_seen))
    raise ValueError(f"learning-rate schedule {schedule!r} is not one of {list(SCHEDULES)}")
