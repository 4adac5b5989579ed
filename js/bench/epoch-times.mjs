// Epoch times of a package trained in Node, for `python -m bench.portable`.
// Usage: node epoch-times.mjs <node|web> <package folder> <X.f32> <y.f32> <rows> <epochs> [auto|unrolled|flat|tensors]
// (auto, the default: Trainer.load's default, the package's steps_<K>.onnx for runs of full batches once they pay
// for their creation, step_flat.onnx for the rest; unrolled: steps_<K>.onnx wherever they fit; flat: step_flat.onnx
// for every step, the state as one vector; tensors: step.onnx, one tensor per state tensor)
// X.f32 / y.f32: float32 little-endian rows (what the package's data input and target take, target encoding
// "value"); they go in as runtime tensors. Prints {"times": [wall seconds per epoch], "cpu": [the process's CPU
// seconds per epoch, all threads], "losses": [...], "threads": 1}.
import {readFile} from 'node:fs/promises';
import {createRequire} from 'node:module';
import {Trainer} from '../node.js';
import {epochClock} from './clock.js';

const [kind, folder, xFile, yFile, rowsText, epochsText, layout = 'auto'] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const ort = require(kind === 'web' ? 'onnxruntime-web' : 'onnxruntime-node');
if (kind === 'web') ort.env.wasm.numThreads = 1;
const rows = Number(rowsText);
const floats = async (file) => {
  const bytes = await readFile(file);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
};
const x = await floats(xFile);
const y = await floats(yFile);
const unrolled = {auto: 'auto', unrolled: true}[layout] || false;
const trainer = await Trainer.load(folder, {ort, flat: layout !== 'tensors', unrolled});
const X = new ort.Tensor('float32', x, [rows, x.length / rows]);
const Y = new ort.Tensor('float32', y, [rows, y.length / rows]);
const clock = epochClock();
await trainer.fit(X, Y, {epochs: Number(epochsText), shuffle: false, callbacks: {onEpochEnd: clock.tick}});
console.log(JSON.stringify({times: clock.wallMs.map((t) => t / 1e3), cpu: clock.cpuMs.map((t) => t / 1e3), losses: trainer.history.map((r) => r.loss), threads: 1,
  versions: ort.env.versions, runs: trainer.runs, steps: trainer.steps}));
