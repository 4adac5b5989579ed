// Train an ortflow training package in Node and write the trained state (and the trained graph).
//
//   node examples/node/train.mjs <package folder> <data .json or .csv> [--epochs 5] [--seed 0] [--no-shuffle]
//        [--header] [--runtime node|web] [--state trained.state] [--model trained.onnx] [--history epochs.json]
//
// The package: `ortflow.export_training_package(estimator, folder)` in Python. The data: a JSON file {"X": [[...]],
// "y": [...]} or a CSV file (one row per sample, the target in the last column; `--header`: the first line names
// the columns), as the user has it: a registered model's package standardizes inside its graphs (the manifest's
// `preprocess`), and a table's package takes the raw cells (text, booleans, dates, gaps), which the library
// converts by column (examples/csv.mjs reads the file). A cell that does not fit is refused with its line and
// column, never read as 0. Back in Python, `ortflow.load_training_state(folder, "trained.state")` reads the state
// (docs/TRAINING_OUTSIDE_PYTHON.md).
// The runtimes come from js/node_modules (`make js/node_modules/.stamp`, or `npm ci --ignore-scripts` in js/).
import {readFile, writeFile} from 'node:fs/promises';
import {createRequire} from 'node:module';
import {parseArgs} from 'node:util';
import {Trainer} from '../../js/node.js';
import {csvData, describeCsvError} from '../csv.mjs';

const {values: opts, positionals} = parseArgs({allowPositionals: true, options: {
  epochs: {type: 'string', default: '5'}, seed: {type: 'string', default: '0'},
  'no-shuffle': {type: 'boolean', default: false}, runtime: {type: 'string', default: 'node'},
  state: {type: 'string', default: 'trained.state'}, model: {type: 'string'}, history: {type: 'string'},
  header: {type: 'boolean', default: false},
}});
if (positionals.length !== 2) {
  console.error('usage: node examples/node/train.mjs <package folder> <data .json or .csv> [--epochs N] [--seed S] ' +
    '[--no-shuffle] [--header] [--runtime node|web] [--state file] [--model file] [--history file]');
  process.exit(2);
}
const [packageFolder, dataFile] = positionals;

const require = createRequire(new URL('../../js/package.json', import.meta.url));
const ort = require(opts.runtime === 'web' ? 'onnxruntime-web' : 'onnxruntime-node');
if (opts.runtime === 'web') ort.env.wasm.numThreads = 1;

async function readData(file, manifest) {
  const text = await readFile(file, 'utf8');
  if (file.endsWith('.json')) return JSON.parse(text);
  return csvData(text, manifest, {header: opts.header, where: file});
}

let data = null;
try {
  const trainer = await Trainer.load(packageFolder, {ort});
  data = await readData(dataFile, trainer.manifest);
  const {X, y} = data;
  const m = trainer.manifest;
  console.log(`package ${trainer.packageId.slice(0, 12)}: ${m.optimizer.name}, batch size ${m.batch_size}, ` +
    `${X.length} rows, ${opts.runtime === 'web' ? 'onnxruntime-web (wasm)' : 'onnxruntime-node'}`);
  const started = performance.now();
  const epochs = [];
  await trainer.fit(X, y, {epochs: Number(opts.epochs), seed: Number(opts.seed), shuffle: !opts['no-shuffle'],
    onEpoch: (logs) => {
      epochs.push(logs);
      console.log(`epoch ${logs.epoch}: loss ${logs.loss.toPrecision(6)}, learning rate ` +
        `${logs.learningRate.toPrecision(4)}`);
    }});
  console.log(`${trainer.steps} steps in ${((performance.now() - started) / 1000).toFixed(2)} s`);
  await writeFile(opts.state, trainer.exportState());
  console.log(`state written to ${opts.state}`);
  if (opts.history) await writeFile(opts.history, JSON.stringify(epochs));
  if (opts.model) {
    await writeFile(opts.model, trainer.exportModel());
    console.log(`trained graph written to ${opts.model}`);
  }
} catch (err) {
  describeCsvError(err, data, dataFile);
  console.error(`${err.name}: ${err.message}`);
  process.exit(1);
}
