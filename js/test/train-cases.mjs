// Trains training packages in Node for the Python tests (tests/test_js_training.py): one process per runtime.
// Usage: node train-cases.mjs <node|web> <jobs.json>; jobs.json holds [{package, load?: {flat}, X, y, fits: [{epochs,
// shuffle, seed, sampleWeight}, ...], state, model?, predictX?, prediction?}]: each job loads its package (with
// `load`'s options), calls fit once per entry of `fits`, and writes the state file (exportState) to `state`, the
// trained graph (exportModel) to `model`, {values: predict(predictX), epochs: the onEpoch records, flat: whether
// step_flat.onnx ran, runs: the runtime runs fit made, unrolled: the steps of the unrolled graphs it had} as JSON to
// `prediction`. A job that throws writes {name, message} to `state` + ".error.json"
// instead.
import {readFile, writeFile} from 'node:fs/promises';
import {Trainer} from '../node.js';
import {runtime} from './runtime.mjs';

const [kind, jobsFile] = process.argv.slice(2);
const ort = await runtime(kind);
const jobs = JSON.parse(await readFile(jobsFile, 'utf8'));
for (const job of jobs) {
  try {
    const trainer = await Trainer.load(job.package, {ort, ...(job.load || {})});
    const epochs = [];
    for (const options of job.fits || [{}]) {
      await trainer.fit(job.X, job.y, {...options, onEpoch: (r) => { epochs.push(r); }});
    }
    await writeFile(job.state, trainer.exportState());
    if (job.model) await writeFile(job.model, trainer.exportModel());
    if (job.prediction) await writeFile(job.prediction, JSON.stringify({values: await trainer.predict(job.predictX),
      epochs, flat: trainer.flat, runs: trainer.runs, unrolled: Array.from(trainer.unrolled.keys())}));
  } catch (err) {
    await writeFile(job.state + '.error.json', JSON.stringify({name: err.name, message: err.message}));
  }
}
