// The Web Worker of worker.html: loads onnxruntime-web's WebAssembly-only build and ortflow, trains the package the
// page names on the rows it sends, reports each epoch, and sends the state back (its buffer transferred, not copied).
//
// Messages from the page: {type: 'train', package, ort, X, y, epochs, seed, shuffle} (or, instead of X and y, csv:
// a CSV file's text, header, source: its name; read by examples/csv.mjs for the package) and {type: 'stop'}.
// To the page: {type: 'loaded', packageId, batchSize}, {type: 'epoch', epoch, logs}, {type: 'done', history, steps,
// state}, {type: 'error', message}.
import {csvData, describeCsvError} from '../csv.mjs';

let stopAsked = false;  // the page's 'stop': the fit ends after the running epoch

async function train({package: packageUrl, ort: ortBase, X, y, csv, header, source, epochs, seed, shuffle}) {
  const ort = await import(`${ortBase}ort.wasm.min.mjs`);
  ort.env.wasm.wasmPaths = ortBase;
  ort.env.wasm.numThreads = 1;
  const {Trainer} = await import('../../js/index.js');
  const trainer = await Trainer.load(packageUrl, {ort});
  postMessage({type: 'loaded', packageId: trainer.packageId, batchSize: trainer.manifest.batch_size});
  const data = csv === undefined ? {X, y} : csvData(csv, trainer.manifest, {header, where: source});
  const onEpochEnd = async (epoch, logs) => {
    postMessage({type: 'epoch', epoch, logs});
    // fit awaits its steps without leaving this task: a timer lets the worker take the page's messages ('stop')
    await new Promise((resolve) => setTimeout(resolve, 0));
    if (stopAsked) trainer.stopTraining = true;  // TensorFlow.js's way: fit stops before its next step
  };
  let history;
  try {
    history = await trainer.fit(data.X, data.y, {epochs, seed, shuffle, callbacks: {onEpochEnd}});
  } catch (err) {
    throw describeCsvError(err, data, source);  // a bad cell's line in the CSV file
  }
  const state = trainer.exportState();
  postMessage({type: 'done', history, steps: trainer.steps, state}, [state.buffer]);
  await trainer.dispose();
}

onmessage = ({data}) => {
  if (data.type === 'stop') {
    stopAsked = true;
  } else if (data.type === 'train') {
    train(data).catch((err) => postMessage({type: 'error', message: `${err.name}: ${err.message}`}));
  }
};
