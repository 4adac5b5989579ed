// Learning-rate schedules (ortflow/optimizers/schedules.py), per epoch, of the rows seen before it.

import {TrainingPackageError} from './format.js';

/** The learning rate of an epoch starting after `rowsSeen` rows (double precision; fed as float32). */
export function learningRateAt(schedule, rowsSeen) {
  const {name, eta0, power_t: powerT, alpha} = schedule;
  if (name === 'constant') return eta0;
  if (name === 'invscaling') return eta0 / Math.pow(rowsSeen + 1, powerT);
  const typw = Math.sqrt(1.0 / Math.sqrt(alpha));
  if (name === 'optimal') {  // onnxcustom's: Bottou's sequence scaled so that the first rate is eta0
    const t0 = 1.0 / (alpha * typw / Math.max(1.0, 2.0 * (1.0 + typw)));
    return eta0 * t0 / (t0 + rowsSeen);
  }
  if (name === 'optimal_sklearn') {  // scikit-learn's SGD sequence, whatever eta0
    const t0 = 1.0 / (typw * alpha);
    return 1.0 / (alpha * (t0 + rowsSeen));
  }
  throw new TrainingPackageError(`the package's learning-rate schedule ${JSON.stringify(name)} is not one of ` +
    '["constant", "invscaling", "optimal", "optimal_sklearn"]');
}
