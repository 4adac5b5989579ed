"""The seeded row order shared by every runtime that trains a training package (:mod:`ortflow.package`).

One generator, written with 32-bit unsigned integer arithmetic only so that JavaScript (``Math.imul``, ``>>>``)
reproduces it bit for bit: **mulberry32** seeded from ``(seed, epoch)``, driving a Fisher–Yates shuffle.

- Seeding: ``a = (seed XOR imul(epoch, 0x9E3779B9)) mod 2**32`` with ``seed`` and ``epoch`` unsigned 32-bit
  integers (``epoch`` counts the epochs the state completed before this one, from 0).
- mulberry32, one draw (every operation modulo 2**32, ``imul`` the low 32 bits of the product)::

      a = a + 0x6D2B79F5
      t = imul(a ^ (a >>> 15), a | 1)
      t = (t + imul(t ^ (t >>> 7), t | 61)) ^ t
      return t ^ (t >>> 14)

- Fisher–Yates on ``order = [0, 1, ..., n - 1]``: for ``i`` from ``n - 1`` down to 1, ``j = draw() % (i + 1)``,
  swap ``order[i]`` and ``order[j]``. (The modulo's bias, under ``n / 2**32``, is kept: it is exact in every
  language.)

A batch is ``order[k * batch_size : (k + 1) * batch_size]``; without shuffling the order is ``0 .. n - 1``.
"""

from __future__ import annotations

import numpy as np

#: the generator's name in a package's manifest
GENERATOR = "mulberry32-fisher-yates"
MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def _imul(a: int, b: int) -> int:
    return (a * b) & MASK


def seed_state(seed: int, epoch: int) -> int:
    """The generator's 32-bit state for ``epoch`` (0-based) of a run seeded with ``seed``."""
    return ((int(seed) & MASK) ^ _imul(int(epoch) & MASK, GOLDEN)) & MASK


def draws(state: int, count: int) -> list[int]:
    """``count`` successive 32-bit draws of mulberry32 from ``state``."""
    out = []
    a = state
    for _ in range(count):
        a = (a + 0x6D2B79F5) & MASK
        t = _imul(a ^ (a >> 15), a | 1)
        t = ((t + _imul(t ^ (t >> 7), t | 61)) & MASK) ^ t
        out.append((t ^ (t >> 14)) & MASK)
    return out


def epoch_order(n_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The row order (a permutation of ``range(n_rows)``, int64) of ``epoch`` for ``seed``."""
    n = int(n_rows)
    if n < 0:
        raise ValueError(f"n_rows={n_rows!r} must be >= 0")
    order = list(range(n))
    values = draws(seed_state(seed, epoch), max(n - 1, 0))
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = values[k] % (i + 1)
        order[i], order[j] = order[j], order[i]
    return np.asarray(order, dtype=np.int64)


__all__ = ["GENERATOR", "draws", "epoch_order", "seed_state"]
