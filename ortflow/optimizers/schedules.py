"""Learning-rate schedules as plain functions of the number of samples seen."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "invscaling", "optimal", "optimal_sklearn")


def learning_rate_at(
    schedule: str, eta0: float, samples_seen: int, power_t: float = 0.25, alpha: float = 1e-4
) -> float:
    """Learning rate after ``samples_seen`` samples.

    ``constant``: eta0. ``invscaling``: eta0 / (samples_seen + 1) ** power_t (scikit-learn MLP's SGD).
    ``optimal``: onnxcustom's ``LearningRateSGD``, Bottou's 1 / (alpha * (t0 + samples_seen)) multiplied by the
    constant that makes the first rate equal to eta0, i.e. eta0 * t0 / (t0 + samples_seen), with t0 = 1 / (alpha *
    eta_init) and eta_init = typw / max(1, 2 * (1 + typw)), typw = sqrt(1 / sqrt(alpha)) (onnxcustom's heuristic):
    t0 = 22,000 samples for alpha=1e-4.
    ``optimal_sklearn``: 1 / (alpha * (t0 + samples_seen)) with t0 = 1 / (eta_init * alpha) and eta_init =
    1 / sqrt(sqrt(alpha)), exactly scikit-learn's SGDRegressor/SGDClassifier sequence (its heuristic divides by
    max(1, dloss(-typw, 1)), which is 1 for its losses since that signed derivative is negative): 10.0 at the first
    sample for alpha=1e-4, whatever eta0.
    """
    if schedule == "constant":
        return eta0
    if schedule == "invscaling":
        return eta0 / (samples_seen + 1) ** power_t
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    if schedule == "optimal":
        t0 = 1.0 / (alpha * typw / max(1.0, 2.0 * (1.0 + typw)))
        return eta0 * t0 / (t0 + samples_seen)
    if schedule == "optimal_sklearn":
        t0 = 1.0 / (typw * alpha)  # eta_init = typw / max(1, dloss(-typw, 1)) with dloss(-typw, 1) < 0
        return 1.0 / (alpha * (t0 + samples_seen))
    raise ValueError(f"learning-rate schedule {schedule!r} is not one of {list(SCHEDULES)}")
