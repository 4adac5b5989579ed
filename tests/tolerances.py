"""Tolerances for float32 results, derived from the magnitudes that enter the computation.

A float32 sum of ``n`` terms computed in any order (recursive, pairwise, vectorised: what differs between CPUs)
is within ``gamma_n * sum(|terms|)`` of the exact sum, ``gamma_n = n * u / (1 - n * u)`` with ``u`` the unit
roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2). Each term is itself a product or a short
chain of float32 operations, a few more roundings of its own magnitude. So two correct float32 computations of the
same sum may differ by up to twice that bound, whatever the value of the sum: a sum that cancels to nearly zero
(a gradient at a near-optimum) has an absolute error set by its terms, not by its result.
"""

from __future__ import annotations

import numpy as np

#: unit roundoff of float32 (half the machine epsilon)
U32 = float(np.finfo(np.float32).eps) / 2
#: roundings per term before it enters the sum (a product, an activation's derivative, a scaling)
TERM_ROUNDINGS = 8


def float32_sum_atol(abs_terms_sum, n_terms: int):
    """The largest difference between two float32 evaluations of a sum of ``n_terms`` terms whose absolute values
    sum to ``abs_terms_sum`` (a scalar or an array, one value per result element)."""
    k = (int(n_terms) + TERM_ROUNDINGS) * U32
    return 2 * k / (1 - k) * np.asarray(abs_terms_sum, dtype=np.float64)


def matmul_atol(a, b):
    """The float32 tolerance of ``a @ b``, element by element: each result sums ``a.shape[-1]`` products."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float32_sum_atol(np.abs(a) @ np.abs(b), a.shape[-1])


def sum_atol(x, axis: int = 0):
    """The float32 tolerance of ``x.sum(axis)``."""
    x = np.asarray(x, np.float64)
    return float32_sum_atol(np.abs(x).sum(axis=axis), x.shape[axis])


def assert_close(actual, expected, rtol: float = 1e-5, atol=0.0, err_msg: str = "") -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` element-wise, where ``atol`` may be an array (one
    tolerance per element, as the functions above give; numpy's assert_allclose takes a scalar only)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{err_msg}: shape {actual.shape} != {expected.shape}"
    excess = np.abs(actual - expected) - (np.asarray(atol, np.float64) + rtol * np.abs(expected))
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else ()
    assert not excess.size or excess[worst] <= 0, (
        f"{err_msg}: {actual[worst]!r} != {expected[worst]!r} at {worst}, "
        f"{excess[worst]:.3g} over the tolerance")
