// The fit API of the JavaScript trainer, case by case, for tests/test_js_fit.py: callbacks, stopTraining, an
// AbortSignal, validation data and split, evaluate, the History, loadState round trips, dispose, bad arguments,
// ragged rows, negative sample weights, a second fit while one runs.
// Usage: node fit-api.mjs <node|web> <config.json>; config: {linear, weighted: package folders, X, y, python: a state
// file Python trained, out: a folder}; prints {case: outcome} as JSON and writes states to `out`.
import {readFile, writeFile} from 'node:fs/promises';
import {Trainer} from '../node.js';
import {runtime} from './runtime.mjs';

const [kind, configFile] = process.argv.slice(2);
const ort = await runtime(kind);
const {linear, weighted, X, y, python, out: folder} = JSON.parse(await readFile(configFile, 'utf8'));
const load = (source = linear, options = {}) => Trainer.load(source, {ort, ...options});
const out = {};
const FIT = {seed: 5, shuffle: true};

async function outcome(f) {
  try {
    return {thrown: false, value: await f()};
  } catch (e) {
    return {thrown: true, name: e.name, message: e.message, epoch: e.epoch, step: e.step};
  }
}
const hex = (bytes) => Buffer.from(bytes).toString('hex');

// callbacks: their order and arguments; the History; the deprecated onEpoch
{
  const t = await load();
  const events = [];
  const callbacks = {
    onTrainBegin: () => { events.push(['trainBegin']); },
    onBatchEnd: (batch, logs) => { events.push(['batch', batch, logs]); },
    onEpochEnd: async (epoch, logs) => {  // awaited: the next epoch starts after it
      await new Promise((r) => setTimeout(r, 1));
      events.push(['epoch', epoch, logs]);
    },
    onTrainEnd: (logs) => { events.push(['trainEnd', logs]); },
  };
  const history = await t.fit(X, y, {...FIT, epochs: 2, callbacks, onEpoch: (r) => { events.push(['onEpoch', r]); }});
  const again = await t.fit(X, y, {...FIT, epochs: 1});
  out.callbacks = {events, history, again, records: t.history, steps: t.steps, epochs: t.epochs};
}

// stopping: stopTraining from onBatchEnd (within an epoch) and onEpochEnd; an AbortSignal aborted in a fit or before
for (const [name, options] of [
  ['stop_batch', (t) => ({callbacks: {onBatchEnd: (b) => { if (b === 2) t.stopTraining = true; }}})],
  ['stop_epoch', (t) => ({callbacks: {onEpochEnd: () => { t.stopTraining = true; }}})],
  ['abort', () => {
    const controller = new AbortController();
    return {signal: controller.signal, callbacks: {onBatchEnd: () => controller.abort()}};
  }],
  ['aborted_before', () => ({signal: AbortSignal.abort()})],
]) {
  const t = await load(linear, {unrolled: true});  // its unrolled graphs wherever they fit: steps_2 runs first
  const history = await t.fit(X, y, {...FIT, epochs: 5, ...options(t)});
  out[name] = {history, steps: t.steps, epochs: t.epochs, rowsSeen: t.rowsSeen};
}

// validation: a split (the last rows) and given data; val_loss is evaluate's value on them at the epoch's state
{
  const t = await load();
  const history = await t.fit(X, y, {...FIT, epochs: 2, validationSplit: 0.25});
  out.validation_split = {history, rowsSeen: t.rowsSeen, evaluate: await t.evaluate(X.slice(45), y.slice(45))};
  const v = await load();
  const given = await v.fit(X.slice(0, 40), y.slice(0, 40),
    {...FIT, epochs: 2, validationData: [X.slice(40), y.slice(40)]});
  out.validation_data = {history: given, evaluate: await v.evaluate(X.slice(40), y.slice(40))};
  out.evaluate_initial = await (await load()).evaluate(X, y);
}

// loadState: JS -> JS (3 epochs in one run against 2, a state file, 1 in a new trainer), on both step layouts
for (const [name, options] of [['flat', {}], ['tensors', {flat: false}]]) {
  const one = await load(linear, options);
  await one.fit(X, y, {...FIT, epochs: 3});
  const first = await load(linear, options);
  await first.fit(X, y, {...FIT, epochs: 2});
  const saved = first.exportState();
  const second = await load(linear, options);
  second.loadState(saved.buffer.slice(saved.byteOffset, saved.byteOffset + saved.byteLength));  // an ArrayBuffer
  await second.fit(X, y, {...FIT, epochs: 1});
  out[`resume_${name}`] = {uninterrupted: hex(one.exportState()), resumed: hex(second.exportState())};
}

// loadState: Python -> JS -> JS -> Python: Python's state, 2 epochs in one JS run against 1 + a state file + 1
{
  const state = new Uint8Array(await readFile(python));
  const untouched = await load();
  untouched.loadState(state);
  await writeFile(`${folder}/untouched.state`, untouched.exportState());
  const one = await load();
  one.loadState(state);
  await one.fit(X, y, {...FIT, epochs: 2});
  await writeFile(`${folder}/uninterrupted.state`, one.exportState());
  const first = await load();
  first.loadState(state);
  await first.fit(X, y, {...FIT, epochs: 1});
  const second = await load();
  second.loadState(first.exportState());
  await second.fit(X, y, {...FIT, epochs: 1});
  await writeFile(`${folder}/resumed.state`, second.exportState());
  out.load_bad = await outcome(async () => (await load()).loadState(state.slice(0, state.length - 4)));
  out.load_other = await outcome(async () => (await load(weighted)).loadState(state));
}

// a second fit (or evaluate, loadState) while one runs; the first one ends as if alone
{
  const t = await load();
  const running = t.fit(X, y, {...FIT, epochs: 3});
  out.concurrent_fit = await outcome(() => t.fit(X, y, {...FIT, epochs: 1}));
  out.concurrent_evaluate = await outcome(() => t.evaluate(X, y));
  out.concurrent_load = await outcome(() => t.loadState(t.exportState()));
  await running;
  const alone = await load();
  await alone.fit(X, y, {...FIT, epochs: 3});
  out.concurrent_state = {first: hex(t.exportState()), alone: hex(alone.exportState())};
}

// predictions while a fit runs (started in callbacks, not awaited there): each succeeds though the epochs' ends replace
// the prediction graph's weights; each epoch's predictions follow its weights
{
  const t = await load();
  const running = [];
  const perEpoch = [];
  await t.fit(X, y, {...FIT, epochs: 3, callbacks: {
    onBatchEnd: () => { running.push(t.predict(X.slice(0, 2))); },
    onEpochEnd: async () => { perEpoch.push(await t.predict(X.slice(0, 1))); },
  }});
  const settled = await Promise.allSettled(running);
  out.predict_during_fit = {statuses: [...new Set(settled.map((s) => s.status))], perEpoch,
    last: await t.predict(X.slice(0, 1)),
    together: await Promise.all([t.evaluate(X, y), t.evaluate(X, y), t.predict(X.slice(0, 1)),
      t.predict(X.slice(0, 1))])};
  await t.dispose();
}

// dispose: a running fit stops; every later call throws
{
  const t = await load();
  const running = t.fit(X, y, {...FIT, epochs: 50});
  await t.dispose();
  const history = await running;
  out.dispose = {epochsDone: history.epoch.length,
    predict: await outcome(() => t.predict(X)), fit: await outcome(() => t.fit(X, y)),
    exportState: await outcome(() => t.exportState()), again: await outcome(() => t.dispose())};
}

// bad arguments (TypeError / RangeError) and bad data (TrainingPackageError)
{
  const t = await load();
  const w = await load(weighted);
  const row = (i, r) => r;
  const cases = {
    epochs_type: () => t.fit(X, y, {epochs: '3'}),
    epochs_range: () => t.fit(X, y, {epochs: -1}),
    epochs_fraction: () => t.fit(X, y, {epochs: 1.5}),
    shuffle_type: () => t.fit(X, y, {shuffle: 'yes'}),
    batch_size: () => t.fit(X, y, {batchSize: 32}),
    unknown_option: () => t.fit(X, y, {epoch: 3}),
    callback_type: () => t.fit(X, y, {callbacks: {onEpochEnd: 3}}),
    callback_name: () => t.fit(X, y, {callbacks: {onEpochStart: () => {}}}),
    signal_type: () => t.fit(X, y, {signal: {}}),
    split_range: () => t.fit(X, y, {validationSplit: 1}),
    validation_type: () => t.fit(X, y, {validationData: [X]}),
    x_type: () => t.fit(42, y),
    evaluate_option: () => t.evaluate(X, y, {weights: 1}),
    load_state_type: () => t.loadState('abc'),
    load_source: () => Trainer.load(42, {ort}),
    load_flat: () => Trainer.load(linear, {ort, flat: 'yes'}),
    load_providers: () => Trainer.load(linear, {ort, executionProviders: 'cpu'}),
    load_option: () => Trainer.load(linear, {ort, unroled: false}),
    ragged_total_kept: () => t.fit(X.map((r, i) => (i === 0 ? [...r, 0.5] : i === 1 ? r.slice(0, 4) : row(i, r))), y),
    ragged_7_3: () => t.fit(X.map((r, i) => (i === 10 ? [...r, 1, 2] : i === 11 ? r.slice(0, 3) : r)), y),
    ragged_y: () => t.fit(X, y.map((v, i) => (i === 4 ? [v, v] : v))),
    ragged_y_total_kept: () => t.fit(X, y.map((v, i) => (i === 4 ? [v, v] : i === 5 ? [] : v))),
    negative_weight: () => w.fit(X, y, {sampleWeight: y.map((v, i) => (i === 7 ? -0.5 : 1))}),
    zero_weights: () => w.fit(X, y, {sampleWeight: y.map(() => 0)}),
    negative_validation_weight: () => w.fit(X, y, {validationData: [X, y, y.map(() => -1)]}),
  };
  for (const [name, f] of Object.entries(cases)) out[name] = await outcome(f);
  out.providers = await outcome(async () => (await (await load(linear, {executionProviders: [kind === 'web' ? 'wasm' :
    'cpu']})).fit(X, y)).epoch);
  out.batch_size_same = await outcome(async () => (await t.fit(X, y, {batchSize: 16})).epoch);
  out.weighted_ok = await outcome(async () => (await w.fit(X, y, {sampleWeight: y.map((v, i) => i % 3)})).epoch);
  out.untouched_after_bad = {steps: t.steps, epochs: t.epochs};
  // a refused fit never counts as running: a fit called right after it (same tick) runs
  const [refused, next] = await Promise.allSettled([t.fit(X, y, {epochs: -1}), t.fit(X, y, {epochs: 1})]);
  out.refused_then_fit = [refused.reason.name, next.status, next.value && next.value.epoch];
}
console.log(JSON.stringify(out));
