// The shuffle generator (ortflow/data/shuffle.py): mulberry32 draws driving a Fisher-Yates shuffle, bit for bit Python's.

/** The generator's 32-bit state for `epoch` (epochs completed before, from 0) of a run seeded with `seed`. */
export function seedState(seed, epoch) {
  return ((seed >>> 0) ^ Math.imul(epoch >>> 0, 0x9e3779b9)) >>> 0;
}

/** mulberry32 from a 32-bit state: a function returning successive unsigned 32-bit draws. */
export function mulberry32(state) {
  let a = state >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t = (t + Math.imul(t ^ (t >>> 7), t | 61)) ^ t;
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** The row order of `epoch` for `seed` (Fisher-Yates driven by mulberry32), as Python's `epoch_order`. */
export function epochOrder(n, seed, epoch) {
  const next = mulberry32(seedState(seed, epoch));
  const order = new Int32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = next() % (i + 1);
    const t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  return order;
}
