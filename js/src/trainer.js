// The trainer: a training package loaded on a runtime (onnxruntime-node or onnxruntime-web, passed in), trained as
// Python's reference loop `ortflow.package.train_package` trains it: the same batches, learning rates and step numbers
// reach the same weights. Every graph's inputs are fed by their manifest role (format.js's inputsByRole).

import {TrainingPackageError, checkGraph, decodeState, encodeState, inputsByRole, parseJson, validateManifest}
  from './format.js';
import {checkFileName, packageReader, sha256Hex} from './files.js';
import {checkFinite, plainRows, sliceColumn, weightsOf} from './data.js';
import {featureColumns, targetColumn} from './tables.js';
import {epochOrder} from './shuffle.js';
import {learningRateAt} from './schedules.js';
import {watchDevice, watchedRun} from './device.js';

/** A second `fit` (or `evaluate`, `loadState`) while a `fit` of the same trainer runs. */
export class ConcurrentFitError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ConcurrentFitError';
  }
}

/** A non-finite training loss: `epoch` and `step` (1-based) name the step; the trainer keeps the state before it. */
export class ConvergenceError extends Error {
  constructor(message, {epoch, step, batch}) {
    super(message);
    this.name = 'ConvergenceError';
    this.epoch = epoch;
    this.step = step;
    this.batch = batch;
  }
}

const ORT_TYPES = {float32: 'float32', float64: 'float64', int64: 'int64', int32: 'int32', int16: 'int16',
  int8: 'int8', uint8: 'uint8', uint16: 'uint16', uint32: 'uint32', uint64: 'uint64', string: 'string',
  bool: 'bool'};
const FIT_OPTIONS = ['epochs', 'shuffle', 'seed', 'sampleWeight', 'batchSize', 'callbacks', 'onEpoch', 'signal',
  'validationData', 'validationSplit'];
const CALLBACKS = ['onEpochEnd', 'onBatchEnd', 'onTrainBegin', 'onTrainEnd'];
const LOAD_OPTIONS = ['ort', 'sessionOptions', 'flat', 'unrolled', 'executionProviders'];
const DATA_ROLES = ['data', 'target', 'sample_weight'];
/** fit yields to the event loop after this much work (ms), so a page's timers and input run during a fit */
const YIELD_EVERY_MS = 40;
/** the share of a single step's time an unrolled graph of K steps is first assumed to save per step, times
 * (1 - 1/K): its runs then measure it (the runtime's overhead per run is most of a small step's time) */
const ASSUMED_SAVING = 0.5;
/** a graph's run time is the median of its last RECENT_RUNS runs */
const RECENT_RUNS = 9;
/** the single step's time is steady (the unrolled graphs are considered) once the median of its last RECENT_RUNS runs
 * is no more than STEADY_DROP below the median of the RECENT_RUNS runs STEADY_WINDOWS windows before: while the
 * runtime's code warms up (V8 compiles WebAssembly in tiers; the first epoch of a wide MLP ran 5-10x slower than
 * later ones in Chromium) single steps look far dearer than they are, and an unrolled graph created for them did
 * not pay */
const STEADY_DROP = 0.15;
const STEADY_WINDOWS = 4;
/** the smallest ONNX graph (Identity of one float, opset 13): onnxruntime-web starts its runtime (the WebAssembly
 * engine's download and compilation) on the first session, so Trainer.load creates this one while the package
 * downloads */
const WARM_UP_GRAPH = 'CAcSADo3ChAKAXgSAXkiCElkZW50aXR5EgF3Wg8KAXgSCgoICAESBAoCCAFiDwoBeRIKCggIARIECgIIAUIECgAQDQ==';

/** A zero-delay macrotask: timers, input and a Stop button of the page run before the promise resolves. */
function nextTask() {
  if (typeof setImmediate === 'function') return new Promise((resolve) => setImmediate(resolve));
  return new Promise((resolve) => {
    const channel = new MessageChannel();  // unlike setTimeout(0), not clamped to 4 ms when chained
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(null);
  });
}

/** onnxruntime-web's runtime started (a session of WARM_UP_GRAPH created and released); never rejects. */
async function startRuntime(ort) {
  try {
    const bytes = Uint8Array.from(atob(WARM_UP_GRAPH), (c) => c.charCodeAt(0));
    const session = await ort.InferenceSession.create(bytes, {executionProviders: ['wasm']});
    await session.release();
  } catch {
    // the step's own session reports what is wrong with the runtime
  }
}

const now = () => (typeof performance !== 'undefined' ? performance.now() : Date.now());

/**
 * A session of `ort` for `model` whose runs go one after the other: onnxruntime-web never settles two runs of one
 * session at once (nor any run after them), and a predict() or evaluate() may start while another runs. `check`
 * ({entry, path, where}): the manifest's entry of that graph, compared with the session (format.js's checkGraph).
 */
async function createSession(ort, model, options, check) {
  const session = await ort.InferenceSession.create(model, options);
  if (check) checkGraph(check.entry, session, check.path, check.where);
  let last = Promise.resolve();
  return {
    run(feeds, fetches) {
      const result = last.then(() => (fetches ? session.run(feeds, fetches) : session.run(feeds)));
      last = result.catch(() => {});
      return result;
    },
    release: () => last.then(() => session.release()),
  };
}

function tensorFor(ort, dtype, data, dims) {
  return new ort.Tensor(ORT_TYPES[dtype] || dtype, data, dims);
}

function checkKeys(what, given, known) {
  if (given === null || typeof given !== 'object' || Array.isArray(given)) {
    throw new TypeError(`${what} must be an object, got ${Array.isArray(given) ? 'an array' : typeof given}`);
  }
  const unknown = Object.keys(given).filter((k) => !known.includes(k) && given[k] !== undefined);
  if (unknown.length) {
    throw new TypeError(`${what} has the unknown keys ${JSON.stringify(unknown)}; known: ${JSON.stringify(known)}`);
  }
}

function checkType(what, value, type) {
  if (value !== undefined && typeof value !== type) {  // eslint-disable-line valid-typeof
    throw new TypeError(`${what} must be a ${type}, got ${value === null ? 'null' : typeof value}`);
  }
}

function checkCount(what, value, max = Number.MAX_SAFE_INTEGER, words = 'an integer >= 0') {
  checkType(what, value, 'number');
  if (value !== undefined && (!Number.isInteger(value) || value < 0 || value > max)) {
    throw new RangeError(`${what}=${JSON.stringify(value)} must be ${words}`);
  }
}

/** A graph the trainer runs, its inputs by role and its outputs: the loss(es) and the updated state. */
function graphPlan(m, entry, what) {
  const known = new Set(m.step.inputs.filter((i) => DATA_ROLES.includes(i.role)).map((i) => i.name));
  for (const input of entry.inputs) {
    const ok = DATA_ROLES.includes(input.role) ? known.has(input.name) :
      ['weight', 'slot', 'state', 'learning_rate', 'step'].includes(input.role);
    if (!ok) {
      throw new TrainingPackageError(`${what}'s input ${JSON.stringify(input.name)} has the role ` +
        `${JSON.stringify(input.role)}, which this library does not feed`);
    }
  }
  const outputs = entry.outputs.map((o) => o.name);
  const has = (name, field) => {
    if (!outputs.includes(name)) {
      throw new TrainingPackageError(`${what}'s ${field} ${JSON.stringify(name)} is not among its outputs ` +
        JSON.stringify(outputs));
    }
    return name;
  };
  if (entry.steps !== undefined) {
    return {entry, steps: entry.steps, losses: has(entry.losses_output, 'losses_output'),
      stateOut: has(entry.state_output, 'state_output')};
  }
  const loss = has(entry.loss_output || m.loss.output, 'loss output');
  if (inputsByRole(entry, 'state').length) {
    return {entry, steps: 1, loss, stateOut: has(entry.state_output, 'state_output')};
  }
  const tensors = entry.inputs.filter((i) => i.role === 'weight' || i.role === 'slot').map((i) => i.name);
  const updated = outputs.filter((o) => o !== loss);  // in the order of the state inputs, as Python reads them
  if (updated.length !== tensors.length) {
    throw new TrainingPackageError(`${what} has ${tensors.length} state inputs and ${updated.length} updated ` +
      'state outputs');
  }
  return {entry, steps: 1, loss, tensors, updated};
}

/** A training package loaded on a runtime: train it (`fit`), evaluate, predict, export or load the state. */
export class Trainer {
  constructor(ort, manifest, files, sessionOptions, single, step, ladder, where) {
    this.ort = ort;
    this.manifest = manifest;
    this.where = where;
    this._files = files;
    this._sessionOptions = sessionOptions;
    this._single = single;
    this._step = step;
    /** whether steps run step_flat.onnx (the whole state as one vector) rather than step.onnx */
    this.flat = !single.tensors;
    /** the unrolled step graphs fit runs for runs of full batches (the manifest's `unrolled`), by steps: K -> entry */
    this.unrolled = new Map(ladder.map((plan) => [plan.steps, plan.entry]));
    this._ladder = new Map(ladder.map((plan) => [plan.steps, plan]));
    /** the unrolled graphs' sessions by steps: promises (read and created once), and those created */
    this._unrolledSessions = new Map();
    this._unrolledReady = new Map();
    /** why an unrolled graph's file or session failed, thrown by the fit that asked for it */
    this._unrolledError = null;
    /** how fit chooses unrolled graphs: 'auto' (when they pay), true (always where they fit), false (never) */
    this._unrolledMode = 'auto';
    /** each graph's run time (ms) by its steps (1: the single step), measured by fit: {ms, count, recent} */
    this._runTimes = new Map();
    /** what creating a session took per byte of its graph (ms): the single step's, set by load, then the latest
     * unrolled graph's */
    this._costs = {createMsPerByte: 0};
    this._reader = null;
    this._predict = null;
    this._fitting = null;
    this._disposed = false;
    /** device.js's watch over a GPU provider's failures (null on the CPU's) */
    this._device = null;
    /** set to true (in a callback, or from elsewhere) to stop the running fit before its next step */
    this.stopTraining = false;
    const m = manifest;
    const stateBytes = files[m.state.file];
    if (stateBytes.length !== m.state.bytes || stateBytes.length % 4) {
      throw new TrainingPackageError(`${m.state.file} has ${stateBytes.length} bytes, the manifest says ` +
        `${m.state.bytes}`);
    }
    const view = new DataView(stateBytes.buffer, stateBytes.byteOffset, stateBytes.byteLength);
    const vector = new Float32Array(m.state.tensors.reduce((total, t) => total + t.length, 0));
    for (let i = 0; i < vector.length; i++) vector[i] = view.getFloat32(4 * i, true);
    this._setState(vector);
    for (const t of m.state.tensors) {
      checkFinite(`${m.state.file} (${JSON.stringify(t.name)})`, this.tensors[t.name], 1);
    }
    const progress = m.progress || {};
    this.epochs = progress.epochs || 0;
    this.steps = progress.steps || 0;
    this.rowsSeen = progress.rows_seen || 0;
    this.rows = 0;
    /** the runtime runs fit made so far (one per step, one per run of an unrolled graph) */
    this.runs = 0;
    /** every epoch's record ({epoch, loss, val_loss?, steps, rowsSeen, learningRate}) over the trainer's fits */
    this.history = [];
    const data = inputsByRole(m.step, 'data');
    const target = inputsByRole(m.step, 'target');
    if (!data.length || target.length !== 1) {
      throw new TrainingPackageError(`the step graph of ${where} needs data inputs and one target input (roles ` +
        '"data" and "target")');
    }
    this._dataSpecs = data;
    this._targetSpec = {...m.target, name: target[0].name};
    this._weightSpec = inputsByRole(m.step, 'sample_weight')[0] || null;
  }

  /**
   * The package at `source` (a folder path with the Node entry, or a URL) on the runtime `ort` (onnxruntime-node or
   * onnxruntime-web). Checks the format, that every file lies inside the package, and the SHA-256 of every file it
   * reads. `sessionOptions` go to `ort.InferenceSession.create` (default: one thread, the runtime's CPU engine;
   * `executionProviders` overrides theirs). `flat` ('auto', true, false): run step_flat.onnx (the state as one
   * vector) rather than step.onnx; `unrolled` (default true, with flat): run K full batches at once by the package's
   * steps_<K>.onnx where it has them.
   */
  static async load(source, options = {}) {
    if (typeof source !== 'string' && !(source instanceof URL)) {
      throw new TypeError(`Trainer.load takes a folder or a URL (string or URL), got ${typeof source}`);
    }
    checkKeys('Trainer.load\'s options', options, LOAD_OPTIONS);
    const {ort, sessionOptions, flat = 'auto', unrolled = 'auto', executionProviders} = options;
    if (!ort || !ort.InferenceSession || !ort.Tensor) {
      throw new TypeError('Trainer.load needs {ort}: the onnxruntime-node or onnxruntime-web module');
    }
    if (flat !== 'auto' && typeof flat !== 'boolean') {
      throw new TypeError(`flat=${JSON.stringify(flat)} must be true, false or 'auto'`);
    }
    if (unrolled !== 'auto' && typeof unrolled !== 'boolean') {
      throw new TypeError(`unrolled=${JSON.stringify(unrolled)} must be true, false or 'auto'`);
    }
    if (executionProviders !== undefined && !Array.isArray(executionProviders)) {
      throw new TypeError('executionProviders must be an array of execution provider names');
    }
    const reader = packageReader(source);
    const onNode = !!(ort.env && ort.env.versions && ort.env.versions.node);
    // onnxruntime-web's engine starts while the package downloads (onnxruntime-node's started when it was imported)
    const runtimeStarted = onNode ? null : startRuntime(ort);
    const manifest = parseJson(await reader.read('manifest.json'), `manifest.json of the package ${reader.where}`);
    const m = validateManifest(manifest, reader.where);
    const names = Object.keys(m.files || {});
    for (const name of names) checkFileName(name, reader.where);
    if (flat === true && !m.step_flat) {
      throw new TrainingPackageError(`the package ${reader.where} has no step_flat graph (flat: true was asked)`);
    }
    const useFlat = flat === 'auto' ? !!m.step_flat : flat;
    const ladder = useFlat && unrolled ? (m.unrolled || []) : [];
    const single = useFlat ? m.step_flat : m.step;
    // the unrolled graphs are read when fit first runs them (Trainer#_unrolledSession), not here
    for (const name of [single.file, m.predict.file, m.state.file, ...ladder.map((u) => u.file)]) {
      checkFileName(name, reader.where);
      if (!names.includes(name)) {
        throw new TrainingPackageError(`the manifest of ${reader.where} lists no checksum for ${name}`);
      }
    }
    const singlePlan = graphPlan(m, single, single.file);
    const ladderPlans = ladder.map((u) => graphPlan(m, u, u.file));
    const sessionSettings = {executionProviders: [onNode ? 'cpu' : 'wasm'], intraOpNumThreads: 1,
      interOpNumThreads: 1, ...(sessionOptions || {}), ...(executionProviders ? {executionProviders} : {})};
    const costs = {createMsPerByte: 0};
    const files = {};
    const read = async (name) => (files[name] = await readChecked(reader, m, name));
    const stepSession = (async () => {  // created as soon as its graph is read, while the other files download
      const bytes = await read(single.file);
      await runtimeStarted;
      const created = now();
      const session = await createSession(ort, bytes, sessionSettings,
        {entry: single, path: single === m.step ? 'step' : 'step_flat', where: reader.where});
      costs.createMsPerByte = (now() - created) / bytes.length;
      return session;
    })();
    stepSession.catch(() => {});  // awaited below, after the other files (whose errors come first)
    let trainer;
    try {
      await Promise.all([...new Set([m.predict.file, m.state.file])].map(read));
      trainer = new Trainer(ort, m, files, sessionSettings, singlePlan, await stepSession, ladderPlans, reader.where);
    } catch (err) {
      stepSession.then((s) => s.release(), () => {});
      throw err;
    }
    trainer._reader = reader;
    trainer._costs = costs;
    trainer._unrolledMode = unrolled;
    trainer._device = await watchDevice(ort, sessionSettings.executionProviders);
    return trainer;
  }

  /** The package's id (the SHA-256 of its step graph): a state names the package it was trained from with it. */
  get packageId() {
    return this.manifest.package_id;
  }

  /** The trained weights (no optimizer slot) by name. */
  get weights() {
    return Object.fromEntries(this.manifest.state.weights.map((w) => [w, this.tensors[w]]));
  }

  _alive() {
    if (this._disposed) throw new Error(`this Trainer of ${this.where} was disposed: load the package again`);
  }

  _idle(what) {
    this._alive();
    if (this._fitting) {
      throw new ConcurrentFitError(`${what} while a fit of this trainer runs: await it first (or stop it with ` +
        'trainer.stopTraining = true or its signal)');
    }
  }

  /** The state as state.bin lays it out; `tensors` views into it by name. */
  _setState(vector) {
    this._vector = vector;
    this.tensors = {};
    for (const t of this.manifest.state.tensors) {
      this.tensors[t.name] = vector.subarray(t.offset / 4, t.offset / 4 + t.length);
    }
    if (this._predict) {  // the prediction graph holds the old weights: released once no run uses it
      this._predict.stale = true;
      releaseIdle(this._predict);
      this._predict = null;
    }
  }

  /** X, y and sample weights as the columns of the step's data, target and sample_weight inputs: {n, columns} (a
   * table's raw cells converted by their columns' kinds, tables.js). */
  _columns(X, y, sampleWeight, names = ['X', 'y', 'sampleWeight']) {
    const columns = featureColumns(this._dataSpecs, X, names[0], this.manifest.preprocess);
    const n = columns[0].n;
    const target = targetColumn(y, this._targetSpec, names[1], this.manifest.preprocess);
    if (target.n !== n) throw new TrainingPackageError(`${names[1]} has ${target.n} rows, ${names[0]} has ${n}`);
    columns.push({spec: this._targetSpec, ...target});
    if (this._weightSpec) {
      columns.push(weightsOf(sampleWeight, this._weightSpec, n, names[2]));
    } else if (sampleWeight !== undefined && sampleWeight !== null) {
      throw new TrainingPackageError(`${names[2]} was given but the package's graph has no weight input`);
    }
    return {n, columns};
  }

  /** The feeds of one run of `plan`'s graph, every input by its role. */
  _feeds(plan, batch, state, rate, step) {
    const feeds = {};
    for (const input of plan.entry.inputs) {
      switch (input.role) {
        case 'state': feeds[input.name] = state.vector; break;
        case 'weight': case 'slot': feeds[input.name] = state.tensors[input.name]; break;
        case 'learning_rate': feeds[input.name] = rate; break;
        case 'step': feeds[input.name] = tensorFor(this.ort, 'float32', Float32Array.of(step), []); break;
        default: feeds[input.name] = batch[input.name];
      }
    }
    return feeds;
  }

  /** The state a run of `plan` returns, as `_feeds` takes it. */
  _next(plan, out) {
    if (!plan.tensors) return {vector: out[plan.stateOut]};
    const tensors = {};
    plan.tensors.forEach((name, i) => { tensors[name] = out[plan.updated[i]]; });
    return {tensors};
  }

  /** The trainer's state as `_feeds` takes it. */
  _stateFeeds() {
    if (this.flat) return {vector: tensorFor(this.ort, 'float32', this._vector, [this._vector.length])};
    return {tensors: Object.fromEntries(this.manifest.state.tensors.map((t) => [t.name,
      tensorFor(this.ort, 'float32', this.tensors[t.name].slice(), t.shape)]))};
  }

  /** Keep the state of a fit (as `_feeds` takes it) as the trainer's. */
  _keep(state) {
    if (state.vector) {
      const data = state.vector.data;
      if (data !== this._vector) this._setState(data instanceof Float32Array ? data : Float32Array.from(data));
      return;
    }
    const vector = new Float32Array(this._vector.length);
    for (const t of this.manifest.state.tensors) vector.set(state.tensors[t.name].data, t.offset / 4);
    this._setState(vector);
  }

  /** Batch makers of prepared columns: {name, column, dtype, dims(rows), gather buffer}. */
  _batchers(columns, maxRows) {
    return columns.map((c) => ({
      name: c.spec.name, c, dtype: c.spec.dtype,
      dims: (rows) => [rows, ...(c.spec.shape.length > 1 ? c.spec.shape.slice(1) : [])],
      gather: Array.isArray(c.data) ? null : new c.data.constructor(maxRows * c.width),
    }));
  }

  _batch(batchers, order, start, rows) {
    const batch = {};
    for (const b of batchers) {
      batch[b.name] = tensorFor(this.ort, b.dtype, batchRows(b, order, start, rows), b.dims(rows));
    }
    return batch;
  }

  /** The mean training loss (the step graph's loss at learning rate 0, batch by batch as fit) of prepared data. */
  async _meanLoss(data, state) {
    const batchSize = this.manifest.batch_size;
    const batchers = this._batchers(data.columns, batchSize);
    const zero = tensorFor(this.ort, 'float32', Float32Array.of(0), []);
    let total = 0;
    for (let start = 0; start < data.n; start += batchSize) {
      const rows = Math.min(batchSize, data.n - start);
      const feeds = this._feeds(this._single, this._batch(batchers, null, start, rows), state, zero, this.steps + 1);
      const out = await watchedRun(this._device, this._step, feeds, this._single, [this._single.loss]);
      total += Number(out[this._single.loss].data[0]) * rows;
    }
    return total / data.n;
  }

  /** The mean loss of the package's training objective over (X, y) at the current state, batches as fit's. */
  async evaluate(X, y, options = {}) {
    this._idle('evaluate');
    checkKeys('evaluate\'s options', options, ['sampleWeight']);
    const data = this._columns(X, y, options.sampleWeight);
    return this._meanLoss(data, this._stateFeeds());
  }

  /**
   * Train for `epochs` epochs from the current state, as Python's `train_package`: each epoch's learning rate from
   * the schedule at the rows seen before it, its row order `epochOrder(n, seed, epochs completed)` (or the rows as
   * given without `shuffle`), batches of the package's batch size (the last one shorter), `step` counting the
   * updates. Callbacks are awaited; `trainer.stopTraining = true` or an aborted `signal` stops before the next step.
   * Returns the History {epoch: [...], history: {loss: [...], val_loss?: [...]}}.
   */
  fit(X, y, options = {}) {
    let plan;
    try {  // the arguments checked and the data prepared before the fit counts as running
      this._idle('fit');
      plan = this._fitPlan(X, y, options);
    } catch (err) {
      return Promise.reject(err);
    }
    const done = this._train(plan);
    this._fitting = done;
    return done.finally(() => { this._fitting = null; });
  }

  /** fit's arguments checked (TypeError, RangeError) and its data prepared (TrainingPackageError). */
  _fitPlan(X, y, options) {
    checkKeys('fit\'s options', options, FIT_OPTIONS);
    const m = this.manifest;
    const {epochs = 1, shuffle = true, seed = 0, sampleWeight, batchSize: askedBatch, callbacks = {}, onEpoch,
      signal, validationData, validationSplit} = options;
    checkCount('epochs', epochs);
    checkCount('seed', seed, 0xffffffff, 'an unsigned 32-bit integer');
    checkType('shuffle', shuffle, 'boolean');
    checkType('batchSize', askedBatch, 'number');
    if (askedBatch !== undefined && askedBatch !== m.batch_size) {
      throw new RangeError(`batchSize=${askedBatch}: the package's step graphs train batches of ${m.batch_size} ` +
        'rows (its batch_size, fixed when it was exported)');
    }
    checkKeys('callbacks', callbacks, CALLBACKS);
    for (const [name, f] of [...Object.entries(callbacks), ['onEpoch', onEpoch]]) checkType(name, f, 'function');
    if (signal !== undefined && (!signal || typeof signal !== 'object' || typeof signal.aborted !== 'boolean')) {
      throw new TypeError('signal must be an AbortSignal');
    }
    if (validationData !== undefined && (!Array.isArray(validationData) || validationData.length < 2 ||
        validationData.length > 3)) {
      throw new TypeError('validationData must be [X, y] or [X, y, sampleWeight]');
    }
    checkType('validationSplit', validationSplit, 'number');
    if (validationSplit !== undefined && !(validationSplit > 0 && validationSplit < 1)) {
      throw new RangeError(`validationSplit=${validationSplit} must lie between 0 and 1 (excluded)`);
    }
    let data = this._columns(X, y, sampleWeight);
    let validation = null;
    if (validationData !== undefined) {
      const [vx, vy, vw] = validationData;
      validation = this._columns(vx, vy, vw, ['validationData[0]', 'validationData[1]', 'validationData[2]']);
    } else if (validationSplit !== undefined) {  // the last rows, before shuffling, as TensorFlow.js takes them
      const at = Math.floor(data.n * (1 - validationSplit));
      if (at < 1 || at >= data.n) {
        throw new RangeError(`validationSplit=${validationSplit} of ${data.n} rows leaves ${at} rows to train on and ` +
          `${data.n - at} to validate: both need at least one`);
      }
      validation = {n: data.n - at, columns: data.columns.map((c) => sliceColumn(c, at, data.n))};
      data = {n: at, columns: data.columns.map((c) => sliceColumn(c, 0, at))};
    }
    return {data, validation, epochs, shuffle, seed, callbacks, onEpoch, signal};
  }

  async _train({data, validation, epochs, shuffle, seed, callbacks, onEpoch, signal}) {
    const m = this.manifest;
    const ort = this.ort;
    const n = data.n;
    const batchSize = m.batch_size;
    const maxSteps = Math.max(1, ...this._ladder.keys());
    const batchers = this._batchers(data.columns, maxSteps * batchSize);
    const stopped = () => this.stopTraining || (signal !== undefined && signal.aborted);
    const history = {epoch: [], history: {loss: []}};
    if (validation) history.history.val_loss = [];
    this.stopTraining = false;
    let state = this._stateFeeds();
    let logs;
    let lastYield = now();
    const fullBatches = Math.floor(n / batchSize);
    try {
      if (callbacks.onTrainBegin) await callbacks.onTrainBegin();
      for (let e = 0; e < epochs && !stopped(); e++) {
        const rate = learningRateAt(m.schedule, this.rowsSeen);
        const learningRate = Math.fround(rate);
        const rateTensor = tensorFor(ort, 'float32', Float32Array.of(rate), []);
        const order = shuffle ? epochOrder(n, seed, this.epochs) : null;
        let total = 0;
        let start = 0;
        let batch = 0;
        let singleUntil = 0; // a run of an unrolled graph with a non-finite loss goes again one step at a time
        while (start < n && !stopped()) {
          if (this._unrolledError) throw this._takeUnrolledError();
          let count = start >= singleUntil ?
            this._unrolledCount(n - start, batchSize, epochs - e - 1, fullBatches) : 0;
          if (count && !this._unrolledReady.has(count)) count = await this._whenCreated(count);
          const plan = count ? this._ladder.get(count) : this._single;
          const rows = count ? count * batchSize : Math.min(batchSize, n - start);
          const session = count ? this._unrolledReady.get(count) : this._step;
          const began = now();
          const out = await watchedRun(this._device, session, this._feeds(plan, this._batch(batchers, order, start,
            rows), state, rateTensor, this.steps + 1), plan);
          if (rows === (count || 1) * batchSize) this._timed(count || 1, now() - began);
          this.runs += 1;
          const losses = count ? out[plan.losses].data : [Number(out[plan.loss].data[0])];
          if (!Array.prototype.every.call(losses, (l) => Number.isFinite(l))) {
            if (count) {
              singleUntil = start + rows;
              continue;
            }
            throw new ConvergenceError(`the training loss is ${losses[0]} at epoch ${this.epochs + 1}, step ` +
              `${this.steps + 1} (batch ${batch + 1})${this._device ? ` on the execution providers ` +
              `${JSON.stringify(this._device.names)}` : ''}: training stopped, the state is the one before this step`,
            {epoch: this.epochs + 1, step: this.steps + 1, batch: batch + 1});
          }
          state = this._next(plan, out);
          const size = count ? batchSize : rows;
          for (let i = 0; i < losses.length; i++) {
            total += losses[i] * size;
            this.steps += 1;
            if (callbacks.onBatchEnd) {
              await callbacks.onBatchEnd(batch, {loss: Number(losses[i]), size, steps: this.steps, learningRate});
            }
            batch += 1;
          }
          start += rows;
          if (now() - lastYield >= YIELD_EVERY_MS) {  // the page's timers, input and Stop button get their turn
            await nextTask();
            lastYield = now();
          }
        }
        if (start < n) break;  // stopped within the epoch: its steps are kept, the epoch is not counted
        this.rowsSeen += n;
        this.epochs += 1;
        this.rows = n;
        logs = {loss: total / n, steps: this.steps, rowsSeen: this.rowsSeen, learningRate};
        if (validation) logs.val_loss = await this._meanLoss(validation, state);
        this._keep(state);
        this.history.push({epoch: this.epochs, ...logs});
        history.epoch.push(this.epochs - 1);
        history.history.loss.push(logs.loss);
        if (validation) history.history.val_loss.push(logs.val_loss);
        if (callbacks.onEpochEnd) await callbacks.onEpochEnd(this.epochs - 1, {...logs});
        if (onEpoch) await onEpoch({epoch: this.epochs, ...logs});
      }
    } finally {
      this._keep(state);
    }
    if (callbacks.onTrainEnd) await callbacks.onTrainEnd(logs ? {...logs} : undefined);
    return history;
  }

  /**
   * The steps the next run runs when `_unrolledCount` chose the graph of `count` steps, whose session does not exist
   * yet. With `unrolled: true` the fit waits for it: `count`. With 'auto' it is read in the background while single
   * steps go on (reading is I/O: only the session's creation holds up the steps): 0. A failure is thrown.
   */
  async _whenCreated(count) {
    const session = this._unrolledSession(count);
    if (this._unrolledMode !== true) return 0;
    await session;
    if (this._unrolledError) throw this._takeUnrolledError();
    return count;
  }

  /** The error of an unrolled graph's file or session, for the fit to throw; a later fit reads the file again. */
  _takeUnrolledError() {
    const err = this._unrolledError;
    this._unrolledError = null;
    return err;
  }

  /**
   * The steps K of the unrolled graph the next run of `rowsLeft` rows of the epoch runs (the epochs after it have
   * `fullBatches` full batches each); 0: a single step. With `unrolled: true` the largest graph that fits; with
   * 'auto' the one that saves the most time over the steps it can still run in this fit, its session's creation
   * (estimated per byte from the latest session's) counted until it exists: none before the single step's time is
   * measured, nor when no graph pays.
   */
  _unrolledCount(rowsLeft, batchSize, epochsAfter, fullBatches) {
    let best = 0;
    let bestGain = 0;
    const single = this._runTimes.get(1);
    for (const k of this._ladder.keys()) {
      if (k * batchSize > rowsLeft) continue;
      if (this._unrolledMode === true) {
        if (k > best) best = k;
        continue;
      }
      if (!single || !single.steady) return 0;
      const steps = Math.floor(rowsLeft / batchSize / k) * k + epochsAfter * Math.floor(fullBatches / k) * k;
      const cost = this._unrolledSessions.has(k) ? 0 :
        this._costs.createMsPerByte * (this.manifest.files[this._ladder.get(k).entry.file].bytes || 0);
      const gain = steps * this._savingPerStep(k, single.ms) - cost;
      if (gain > bestGain) {
        best = k;
        bestGain = gain;
      }
    }
    return best;
  }

  /** The time (ms) a step run by the unrolled graph of `k` steps saves against a single step (`singleMs`): measured
   * once it ran 3 times, else the share of the graphs measured so far (ASSUMED_SAVING before any). */
  _savingPerStep(k, singleMs) {
    const measured = this._runTimes.get(k);
    if (measured && measured.count >= 3) return singleMs - measured.ms / k;
    let share = ASSUMED_SAVING;
    for (const [steps, t] of this._runTimes) {
      if (steps > 1 && t.count >= 3) {
        share = Math.min(1, Math.max(0, (singleMs - t.ms / steps) / (singleMs * (1 - 1 / steps))));
      }
    }
    return share * singleMs * (1 - 1 / k);
  }

  /** A run's wall time (ms) of the graph of `steps` steps: per graph, the median of its last RECENT_RUNS runs (the
   * first runs are slower: the runtime's code warms up), how many ran, and whether the median stopped falling
   * (`steady`: against the median of each full window of RECENT_RUNS runs before, the last STEADY_WINDOWS kept). */
  _timed(steps, ms) {
    let t = this._runTimes.get(steps);
    if (!t) this._runTimes.set(steps, t = {ms, count: 0, recent: [], windows: [], steady: false});
    t.recent.push(ms);
    if (t.recent.length > RECENT_RUNS) t.recent.shift();
    const sorted = [...t.recent].sort((a, b) => a - b);
    t.ms = sorted[sorted.length >> 1];
    t.count += 1;
    if (t.count % RECENT_RUNS === 0) {
      t.steady = t.windows.length === STEADY_WINDOWS && t.ms >= (1 - STEADY_DROP) * t.windows[0];
      t.windows.push(t.ms);
      if (t.windows.length > STEADY_WINDOWS) t.windows.shift();
    }
  }

  /** The unrolled graph of `count` steps read (and checked) and its session created, once: a promise that never
   * rejects (a failure is kept in `_unrolledError`). */
  _unrolledSession(count) {
    if (!this._unrolledSessions.has(count)) {
      const {entry} = this._ladder.get(count);
      const costs = this._costs;
      const session = readChecked(this._reader, this.manifest, entry.file).then(async (bytes) => {
        const started = now();
        const created = await createSession(this.ort, bytes, this._sessionOptions,
          {entry, path: `unrolled[${this.manifest.unrolled.indexOf(entry)}]`, where: this.where});
        costs.createMsPerByte = (now() - started) / bytes.length;  // the latest: the runtime's code warmed up
        if (this._disposed) {
          await created.release();
        } else {
          this._unrolledReady.set(count, created);
        }
        return created;
      }).catch((err) => {
        this._unrolledError = err;
        this._unrolledSessions.delete(count);
        return null;
      });
      this._unrolledSessions.set(count, session);
    }
    return this._unrolledSessions.get(count);
  }

  /** The trained prediction graph's outputs for X: {outputName: ort.Tensor}. */
  async run(X) {
    this._alive();
    const feeds = {};
    for (const c of featureColumns(this._dataSpecs, X, 'X', this.manifest.preprocess)) {
      const spec = this.manifest.predict.inputs.find((i) => i.name === c.spec.name) || c.spec;
      feeds[c.spec.name] = tensorFor(this.ort, c.spec.dtype, c.data, [c.n, ...spec.shape.slice(1).map((d, i) =>
        (typeof d === 'number' ? d : c.spec.shape[i + 1]))]);
    }
    if (!this._predict) {
      this._predict = {session: createSession(this.ort, this.exportModel(), this._sessionOptions,
        {entry: this.manifest.predict, path: 'predict', where: this.where}), busy: 0,
        stale: false};
    }
    const predict = this._predict;
    predict.busy += 1;
    try {
      return await (await predict.session).run(feeds);
    } finally {
      predict.busy -= 1;
      releaseIdle(predict);
    }
  }

  /**
   * The trained graph's first output for X as plain values: one value per row (a class label, a number) or one
   * array per row (scores of several columns). `run(X)` gives every output as tensors.
   */
  async predict(X) {
    const outputs = await this.run(X);
    return plainRows(outputs[this.manifest.predict.outputs[0].name]);
  }

  /** The state file (what Python's `load_training_state` reads): the weights, slots and progress. */
  exportState() {
    this._alive();
    return encodeState(this.manifest, this._vector, {epochs: this.epochs, steps: this.steps, rowsSeen: this.rowsSeen,
      rows: this.rows});
  }

  /** Resume from a state file of this package (`exportState()`'s, or Python's `TrainingState.to_bytes()`). */
  loadState(bytes) {
    this._idle('loadState');
    if (bytes instanceof ArrayBuffer) bytes = new Uint8Array(bytes);
    if (!(bytes instanceof Uint8Array)) {
      throw new TypeError(`loadState takes the state file's bytes (a Uint8Array or an ArrayBuffer), got ${
        bytes === null ? 'null' : typeof bytes}`);
    }
    const {state, progress} = decodeState(bytes, this.manifest, 'the state given to loadState');
    this._setState(state);
    this.epochs = progress.epochs;
    this.steps = progress.steps;
    this.rowsSeen = progress.rowsSeen;
    this.rows = progress.rows;
    return this;
  }

  /** The trained prediction graph (ONNX bytes, weights inside): the package's graph with these weights written over
   * their byte ranges. Any ONNX runtime runs it. */
  exportModel() {
    this._alive();
    const m = this.manifest;
    const out = new Uint8Array(this._files[m.predict.file]);
    const view = new DataView(out.buffer);
    for (const patch of m.predict.weights) {
      const values = this.tensors[patch.name];
      if (!values || 4 * values.length !== patch.bytes || patch.offset + patch.bytes > out.length) {
        throw new TrainingPackageError(`weight ${JSON.stringify(patch.name)} of the prediction graph takes ` +
          `${patch.bytes} bytes at ${patch.offset}; the state has ${values ? 4 * values.length : 'no such tensor'}`);
      }
      for (let i = 0; i < values.length; i++) view.setFloat32(patch.offset + 4 * i, values[i], true);
    }
    return out;
  }

  /** Release every session (a running fit stops first); any later call throws. */
  async dispose() {
    if (this._disposed) return;
    if (this._fitting) {
      this.stopTraining = true;
      await this._fitting.catch(() => {});
    }
    this._disposed = true;
    if (this._device) this._device.stop();
    const sessions = [this._step, ...this._unrolledReady.values()];  // one created after this releases itself
    this._unrolledSessions.clear();
    this._unrolledReady.clear();
    let predict = null;
    if (this._predict) {  // a prediction running now releases its session when it ends
      this._predict.stale = true;
      predict = releaseIdle(this._predict);
      this._predict = null;
    }
    await Promise.all([...sessions.map(async (s) => (await s).release()), predict]);
  }
}

/** The file `name` of the package `m` read by `reader`, its SHA-256 checked against the manifest's. */
async function readChecked(reader, m, name) {
  const bytes = await reader.read(name);
  const expected = m.files[name].sha256;
  const actual = await sha256Hex(bytes);
  if (actual !== expected) {
    throw new TrainingPackageError(`${name} of the package ${reader.where} does not match the manifest's ` +
      `checksum (SHA-256 ${actual}, the manifest says ${expected})`);
  }
  return bytes;
}

/** Release a prediction session whose weights are stale once no run uses it: the release's promise, or null. */
function releaseIdle(predict) {
  if (!predict.stale || predict.busy > 0 || predict.released) return null;
  predict.released = true;
  return predict.session.then((s) => s.release()).catch(() => {});
}

function batchRows(b, order, start, rows) {
  const {data, width} = b.c;
  if (!order) {  // copied: onnxruntime-node takes a view into a large array more slowly than a small array
    if (!b.gather) return data.slice(start * width, (start + rows) * width);
    const out = b.gather.subarray(0, rows * width);
    out.set(data.subarray(start * width, (start + rows) * width));
    return out;
  }
  const out = b.gather ? b.gather.subarray(0, rows * width) : new Array(rows * width);
  for (let r = 0; r < rows; r++) {
    const from = order[start + r] * width;
    if (b.gather && width > 8) {
      out.set(data.subarray(from, from + width), r * width);
    } else {
      for (let k = 0; k < width; k++) out[r * width + k] = data[from + k];
    }
  }
  return out;
}
