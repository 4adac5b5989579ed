// ortflow's training packages in JavaScript: train a package written by Python's
// `ortflow.export_training_package` on onnxruntime-node or onnxruntime-web (the caller passes the runtime), and hand
// back a state Python's `ortflow.load_training_state` reads, or the trained prediction graph.
// The format and the training loop are docs/TRAINING_OUTSIDE_PYTHON.md's; Python's reference loop is
// `ortflow.package.train_package`: the same batches, learning rates and step numbers reach the same weights.
// This is the browser-safe entry (nothing here imports a `node:` module); node.js adds the folder reader of Node.

export {FORMAT, FORMAT_VERSION, STATE_FORMAT, GENERATOR, TrainingPackageError} from './src/format.js';
export {seedState, mulberry32, epochOrder} from './src/shuffle.js';
export {learningRateAt} from './src/schedules.js';
export {Trainer, ConcurrentFitError, ConvergenceError} from './src/trainer.js';
export {ExecutionProviderError} from './src/device.js';
// Every module the library runs is named here, so a browser loading index.js as it is (no bundler) requests them all
// at once after it, rather than the ones these import a round trip later.
export {} from './src/schema.js';
export {} from './src/files.js';
export {} from './src/data.js';
export {} from './src/tables.js';
