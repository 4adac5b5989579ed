// Epoch times of TensorFlow.js 4.22 in Node, for `python -m bench.portable` (the TF.js comparison): the MLP of
// ortflow's package (Dense(hidden, relu) -> Dense(1)) from its start weights, Adam, mean squared error, batches in
// row order, on the WebAssembly backend (`@tensorflow/tfjs-backend-wasm`, one thread; tfjs-node's native library
// can't be downloaded here) or TF.js's plain JavaScript `cpu` backend.
// Usage: node tfjs-epoch-times.mjs <wasm|cpu> <weights.json> <X.f32> <y.f32> <rows> <epochs> <batch> <rate> <beta1>
//   <beta2> <epsilon>
// Prints {"times": [wall seconds per epoch], "cpu": [process CPU seconds per epoch], "losses": [...], "backend"}.
import {readFile} from 'node:fs/promises';
import {createRequire} from 'node:module';
import path from 'node:path';
import * as tf from '@tensorflow/tfjs';
import {setThreadsCount, setWasmPaths} from '@tensorflow/tfjs-backend-wasm';
import {epochClock} from './clock.js';

const [backend, weightsFile, xFile, yFile, rowsText, epochsText, batch, rate, beta1, beta2, epsilon] =
  process.argv.slice(2);
if (backend === 'wasm') {
  const dist = path.dirname(createRequire(import.meta.url).resolve('@tensorflow/tfjs-backend-wasm'));
  setWasmPaths(dist + path.sep);
  setThreadsCount(1);
}
await tf.setBackend(backend);
const floats = async (file) => {
  const bytes = await readFile(file);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
};
const rows = Number(rowsText);
const x = await floats(xFile);
const y = await floats(yFile);
const weights = JSON.parse(await readFile(weightsFile, 'utf8'));
const w = (name) => tf.tensor(weights[name].values, weights[name].shape);
const model = tf.sequential({layers: [
  tf.layers.dense({inputShape: [weights.kernel0.shape[0]], units: weights.kernel0.shape[1], activation: 'relu'}),
  tf.layers.dense({units: weights.kernel1.shape[1]})]});
model.setWeights([w('kernel0'), w('bias0'), w('kernel1'), w('bias1')]);
model.compile({optimizer: tf.train.adam(Number(rate), Number(beta1), Number(beta2), Number(epsilon)),
  loss: 'meanSquaredError'});
const clock = epochClock();
const history = await model.fit(tf.tensor2d(x, [rows, x.length / rows]), tf.tensor2d(y, [rows, y.length / rows]), {
  epochs: Number(epochsText), batchSize: Number(batch), shuffle: false, verbose: 0, callbacks: {onEpochEnd: clock.tick}});
console.log(JSON.stringify({times: clock.wallMs.map((t) => t / 1e3), cpu: clock.cpuMs.map((t) => t / 1e3), losses: history.history.loss, backend: tf.getBackend()}));
