// Train an ortflow training package in Node and write the trained state (and the trained graph).
//
//   node examples/node/train.mjs <package folder> <data .json or .csv> [--epochs 5] [--seed 0] [--no-shuffle]
//        [--runtime node|web] [--state trained.state] [--model trained.onnx]
//
// The package: `ortflow.export_training_package(estimator, folder)` in Python. The data: a JSON file {"X": [[...]],
// "y": [...]} or a CSV file (one row per sample, the target in the last column, no header). Back in Python,
// `ortflow.load_training_state(folder, "trained.state")` reads the state (docs/TRAINING_OUTSIDE_PYTHON.md).
// The runtimes come from js/node_modules (`make js/node_modules/.stamp`, or `npm ci --ignore-scripts` in js/).
import {readFile, writeFile} from 'node:fs/promises';
import {createRequire} from 'node:module';
import {parseArgs} from 'node:util';
import {Trainer} from '../../js/node.js';

const {values: opts, positionals} = parseArgs({allowPositionals: true, options: {
  epochs: {type: 'string', default: '5'}, seed: {type: 'string', default: '0'},
  'no-shuffle': {type: 'boolean', default: false}, runtime: {type: 'string', default: 'node'},
  state: {type: 'string', default: 'trained.state'}, model: {type: 'string'},
}});
if (positionals.length !== 2) {
  console.error('usage: node examples/node/train.mjs <package folder> <data .json or .csv> [--epochs N] [--seed S] ' +
    '[--no-shuffle] [--runtime node|web] [--state file] [--model file]');
  process.exit(2);
}
const [packageFolder, dataFile] = positionals;

const require = createRequire(new URL('../../js/package.json', import.meta.url));
const ort = require(opts.runtime === 'web' ? 'onnxruntime-web' : 'onnxruntime-node');
if (opts.runtime === 'web') ort.env.wasm.numThreads = 1;

async function readData(file) {
  const text = await readFile(file, 'utf8');
  if (file.endsWith('.json')) return JSON.parse(text);
  const rows = text.trim().split(/\r?\n/).map((line) => line.split(','));
  const value = (v) => (v.trim() !== '' && !Number.isNaN(Number(v)) ? Number(v) : v.trim());
  return {X: rows.map((r) => r.slice(0, -1).map(Number)), y: rows.map((r) => value(r[r.length - 1]))};
}

try {
  const trainer = await Trainer.load(packageFolder, {ort});
  const {X, y} = await readData(dataFile);
  const m = trainer.manifest;
  console.log(`package ${trainer.packageId.slice(0, 12)}: ${m.optimizer.name}, batch size ${m.batch_size}, ` +
    `${X.length} rows, ${opts.runtime === 'web' ? 'onnxruntime-web (wasm)' : 'onnxruntime-node'}`);
  const started = performance.now();
  await trainer.fit(X, y, {epochs: Number(opts.epochs), seed: Number(opts.seed), shuffle: !opts['no-shuffle'],
    onEpoch: ({epoch, loss, learningRate}) => console.log(
      `epoch ${epoch}: loss ${loss.toPrecision(6)}, learning rate ${learningRate.toPrecision(4)}`)});
  console.log(`${trainer.steps} steps in ${((performance.now() - started) / 1000).toFixed(2)} s`);
  await writeFile(opts.state, trainer.exportState());
  console.log(`state written to ${opts.state}`);
  if (opts.model) {
    await writeFile(opts.model, trainer.exportModel());
    console.log(`trained graph written to ${opts.model}`);
  }
} catch (err) {
  console.error(`${err.name}: ${err.message}`);
  process.exit(1);
}
