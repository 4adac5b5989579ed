// Trains training packages in Node for the Python tests (tests/test_js_training.py): one process per runtime.
// Usage: node train-cases.mjs <node|web> <jobs.json>; jobs.json holds [{package, load?: {flat}, X, y, fits: [{epochs,
// shuffle, seed, sampleWeight}, ...], state, model?, predictX?, prediction?}]: each job is trained by
// train-jobs.js's trainJob, which writes the state file (exportState) to `state`, the trained graph (exportModel) to
// `model`, its report (predictions, the onEpoch records, flat, runs, unrolled) as JSON to `prediction`. A job that
// throws writes {name, message} to `state` + ".error.json" instead.
import {readFile, writeFile} from 'node:fs/promises';
import {Trainer} from '../node.js';
import {runtime} from './runtime.mjs';
import {trainJob} from './train-jobs.js';

const [kind, jobsFile] = process.argv.slice(2);
const ort = await runtime(kind);
const jobs = JSON.parse(await readFile(jobsFile, 'utf8'));
for (const job of jobs) {
  try {
    const {state, model, report} = await trainJob(Trainer, ort, job);
    await writeFile(job.state, state);
    if (job.model) await writeFile(job.model, model);
    if (job.prediction) await writeFile(job.prediction, JSON.stringify(report));
  } catch (err) {
    await writeFile(job.state + '.error.json', JSON.stringify({name: err.name, message: err.message}));
  }
}
