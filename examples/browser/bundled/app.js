// A bundled app that trains an ortflow training package in the page and sends the state back (js/README.md).
//
//   npm i ortflow onnxruntime-web
//   npx vite build                      # dist/: index.html, the bundle and ort-wasm-simd-threaded.wasm
//   # or: npx webpack                   # dist/: the bundle and the .wasm (webpack.config.mjs); cp index.html dist/
//   # or: npx esbuild app.js --bundle --format=esm --outfile=dist/app.js
//   #     cp index.html node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm dist/
//
// Serve dist/ with the package and open index.html?package=<package URL>&data=<{X, y} JSON URL>[&post=<URL>]
// [&epochs=3][&seed=0]. `onnxruntime-web/wasm` is the WebAssembly-only build: a 14 MB .wasm instead of the
// WebGPU/WebNN build's 28 MB, and faster training on the wasm execution provider.
// Sending the state back to the team: tracking=<the MLflow tracking server's URL> (`make server`; it must allow
// this page's origin: --cors-allowed-origins), experiment, sourceModel, sourceVersion and tag=key=value
// (repeatable), as the plain page (../index.html) takes them: the state is logged to a new run there by
// ../mlflow.js, and `python -m pipelines.import_states --run RUN_ID` registers it as a new version.
import * as ort from 'onnxruntime-web/wasm';
import {Trainer} from 'ortflow';
import {logStateToMlflow, trackingOptions} from '../mlflow.js';

ort.env.wasm.numThreads = 1;  // no worker threads: the page needs no cross-origin isolation

const params = new URLSearchParams(location.search);
const log = (line) => { document.getElementById('log').textContent += `${line}\n`; };

async function main() {
  const trainer = await Trainer.load(new URL(params.get('package'), location.href), {ort});
  const response = await fetch(params.get('data'));
  if (!response.ok) throw new Error(`cannot read the data: HTTP ${response.status}`);
  const {X, y} = await response.json();
  const epochs = Number(params.get('epochs') ?? 3);
  const progress = document.getElementById('progress');
  progress.max = epochs;
  const records = [];  // each epoch's logs, for the tracking server
  const history = await trainer.fit(X, y, {epochs, seed: Number(params.get('seed') ?? 0), callbacks: {
    onEpochEnd: (epoch, logs) => {
      progress.value = epoch + 1;
      records.push({epoch: epoch + 1, ...logs});
      log(`epoch ${epoch + 1}: loss ${logs.loss.toPrecision(6)}`);
    }}});
  if (params.has('post')) {  // send the state back: Python's ortflow.load_training_state(package, state) reads it
    const sent = await fetch(params.get('post'), {method: 'POST', body: trainer.exportState()});
    if (!sent.ok) throw new Error(`POST ${params.get('post')}: HTTP ${sent.status}`);
  }
  const tracking = trackingOptions(params);
  let run = null;
  if (tracking) {  // or log it to a run of the team's tracking server
    run = await logStateToMlflow(tracking.server, {...tracking, state: trainer.exportState(),
                                                   packageId: trainer.packageId, epochs: records});
    log(`state logged to run ${run.runId} of ${tracking.server} (experiment ${tracking.experiment})`);
  }
  await trainer.dispose();
  return {history, run};
}

main().then(
  (result) => { window.ortflowResult = result; },
  (err) => { log(`${err.name}: ${err.message}`); window.ortflowError = `${err.name}: ${err.message}`; });
