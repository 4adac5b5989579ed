"""Learning-rate schedules as plain functions of the number of samples seen (scikit-learn's definitions)."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "invscaling", "optimal")


def learning_rate_at(
    schedule: str, eta0: float, samples_seen: int, power_t: float = 0.25, alpha: float = 1e-4
) -> float:
    """Learning rate after ``samples_seen`` samples.

    ``constant``: eta0. ``invscaling``: eta0 / (samples_seen + 1) ** power_t (scikit-learn MLP's SGD).
    ``optimal``: 1 / (alpha * (t0 + samples_seen)) with Bottou's t0 (scikit-learn's SGDRegressor).
    """
    if schedule == "constant":
        return eta0
    if schedule == "invscaling":
        return eta0 / (samples_seen + 1) ** power_t
    if schedule == "optimal":
        typw = math.sqrt(1.0 / math.sqrt(alpha))
        eta_init = typw / max(1.0, typw)  # squared loss: dloss(-typw, 1) bounded by typw
        t0 = 1.0 / (eta_init * alpha)
        return 1.0 / (alpha * (t0 + samples_seen))
    raise ValueError(f"learning-rate schedule {schedule!r} is not one of {list(SCHEDULES)}")
