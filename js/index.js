// ortflow's training packages in JavaScript: train a package written by Python's
// `ortflow.export_training_package` on onnxruntime-node or onnxruntime-web (the caller passes the runtime), and hand
// back a state Python's `ortflow.load_training_state` reads, or the trained prediction graph.
// The format and the training loop are docs/TRAINING_OUTSIDE_PYTHON.md's; Python's reference loop is
// `ortflow.package.train_package`: the same batches, learning rates and step numbers reach the same weights.
// No build step, no dependency but the runtime passed in: an ES module for Node 20+ and browsers.

export const FORMAT = 'ortflow-training-package';
export const FORMAT_VERSION = 1;
export const STATE_FORMAT = 'ortflow-training-state';
export const GENERATOR = 'mulberry32-fisher-yates';
const STATE_MAGIC = [0x4f, 0x46, 0x54, 0x53]; // "OFTS"

/** An Error naming what is wrong with a package, a state or the data given to train it. */
export class TrainingPackageError extends Error {
  constructor(message) {
    super(message);
    this.name = 'TrainingPackageError';
  }
}

// --- the shuffle generator (ortflow/shuffle.py) -------------------------------------------------------------

/** The generator's 32-bit state for `epoch` (epochs completed before, from 0) of a run seeded with `seed`. */
export function seedState(seed, epoch) {
  return ((seed >>> 0) ^ Math.imul(epoch >>> 0, 0x9e3779b9)) >>> 0;
}

/** mulberry32 from a 32-bit state: a function returning successive unsigned 32-bit draws. */
export function mulberry32(state) {
  let a = state >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t = (t + Math.imul(t ^ (t >>> 7), t | 61)) ^ t;
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** The row order of `epoch` for `seed` (Fisher-Yates driven by mulberry32), as Python's `epoch_order`. */
export function epochOrder(n, seed, epoch) {
  const next = mulberry32(seedState(seed, epoch));
  const order = new Int32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = next() % (i + 1);
    const t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  return order;
}

// --- learning-rate schedules (ortflow/schedules.py) ---------------------------------------------------------

/** The learning rate of an epoch starting after `rowsSeen` rows (double precision; fed as float32). */
export function learningRateAt(schedule, rowsSeen) {
  const {name, eta0, power_t: powerT, alpha} = schedule;
  if (name === 'constant') return eta0;
  if (name === 'invscaling') return eta0 / Math.pow(rowsSeen + 1, powerT);
  const typw = Math.sqrt(1.0 / Math.sqrt(alpha));
  if (name === 'optimal') {  // onnxcustom's: Bottou's sequence scaled so that the first rate is eta0
    const t0 = 1.0 / (alpha * typw / Math.max(1.0, 2.0 * (1.0 + typw)));
    return eta0 * t0 / (t0 + rowsSeen);
  }
  if (name === 'optimal_sklearn') {  // scikit-learn's SGD sequence, whatever eta0
    const t0 = 1.0 / (typw * alpha);
    return 1.0 / (alpha * (t0 + rowsSeen));
  }
  throw new TrainingPackageError(`the package's learning-rate schedule ${JSON.stringify(name)} is not one of ` +
    '["constant", "invscaling", "optimal", "optimal_sklearn"]');
}

// --- files -------------------------------------------------------------------------------------------------

const isNode = typeof process !== 'undefined' && !!(process.versions && process.versions.node) &&
  typeof window === 'undefined';

/** A reader of the package's files: a folder path (Node), or a URL (browser, or http(s) in Node). */
async function fileReader(source) {
  const text = source instanceof URL ? source.href : String(source);
  const local = isNode && !/^https?:/i.test(text);
  if (local) {
    const [{readFile}, path, url] = await Promise.all([import('node:fs/promises'), import('node:path'),
      import('node:url')]);
    const folder = text.startsWith('file:') ? url.fileURLToPath(text) : text;
    return {
      where: folder,
      read: async (name) => {
        try {
          return new Uint8Array(await readFile(path.join(folder, name)));
        } catch (err) {
          throw new TrainingPackageError(`cannot read ${name} of the package ${folder}: ${err.message}`);
        }
      },
    };
  }
  const base = new URL(text.endsWith('/') ? text : text + '/',
    typeof location !== 'undefined' ? location.href : undefined);
  return {
    where: base.href,
    read: async (name) => {
      const response = await fetch(new URL(name, base));
      if (!response.ok) {
        throw new TrainingPackageError(`cannot read ${name} of the package ${base.href}: HTTP ${response.status}`);
      }
      return new Uint8Array(await response.arrayBuffer());
    },
  };
}

async function sha256Hex(bytes) {
  const digest = new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

function checkManifest(m, where) {
  if (!m || m.format !== FORMAT || m.format_version !== FORMAT_VERSION) {
    throw new TrainingPackageError(`the package ${where} has format ${JSON.stringify(m && m.format)} version ` +
      `${JSON.stringify(m && m.format_version)}; this library reads ${JSON.stringify(FORMAT)} version ` +
      `${FORMAT_VERSION}`);
  }
  if (m.shuffle && m.shuffle.generator !== GENERATOR) {
    throw new TrainingPackageError(`the package ${where} shuffles with ${JSON.stringify(m.shuffle.generator)}; ` +
      `this library implements ${JSON.stringify(GENERATOR)}`);
  }
  if (m.state.dtype !== 'float32' || m.state.byte_order !== 'little') {
    throw new TrainingPackageError(`the package ${where} stores its state as ${m.state.dtype} ` +
      `${m.state.byte_order}-endian; this library reads float32 little-endian`);
  }
}

// --- data -------------------------------------------------------------------------------------------------

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array, int16: Int16Array,
  int8: Int8Array, uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array, uint64: BigUint64Array,
};
const ORT_TYPES = {float32: 'float32', float64: 'float64', int64: 'int64', int32: 'int32', int16: 'int16',
  int8: 'int8', uint8: 'uint8', uint16: 'uint16', uint32: 'uint32', uint64: 'uint64', string: 'string',
  bool: 'bool'};

function isTensor(x) {
  return x !== null && typeof x === 'object' && Array.isArray(x.dims) && 'data' in x && typeof x.type === 'string';
}

function rowWidth(shape) {
  return shape.slice(1).reduce((a, d) => (typeof d === 'number' ? a * d : NaN), 1);
}

function flattenRow(row, out) {
  if (Array.isArray(row) || ArrayBuffer.isView(row)) {
    for (const v of row) flattenRow(v, out);
  } else {
    out.push(row);
  }
  return out;
}

/** One input's rows as a flat typed array of the input's dtype: {n, width, data}. */
function columnOf(what, spec, given, fixedWidth) {
  const dtype = spec.dtype;
  const Kind = ARRAYS[dtype];
  let n;
  let values;
  if (isTensor(given)) {
    n = given.dims.length ? given.dims[0] : 1;
    values = given.data;
  } else if (Array.isArray(given) || ArrayBuffer.isView(given)) {
    n = given.length;
    const flat = [];
    for (const row of given) flattenRow(row, flat);
    values = flat;
  } else {
    throw new TrainingPackageError(`${what} must be an array of rows or a tensor, got ${typeof given}`);
  }
  if (n === 0) throw new TrainingPackageError(`${what} is empty: at least one row is needed`);
  const width = values.length / n;
  const expected = fixedWidth !== undefined ? fixedWidth : rowWidth(spec.shape);
  if (!Number.isInteger(width) || (Number.isFinite(expected) && width !== expected)) {
    throw new TrainingPackageError(`${what} has ${values.length} values in ${n} rows; the package's ` +
      `${JSON.stringify(spec.name)} takes rows of ${expected} values (shape ${JSON.stringify(spec.shape)})`);
  }
  let data;
  if (dtype === 'string' || dtype === 'bool') {
    data = Array.from(values);
  } else if (!Kind) {
    throw new TrainingPackageError(`the package's input ${JSON.stringify(spec.name)} has dtype ${dtype}, ` +
      'which this library does not feed');
  } else if (values instanceof Kind) {
    data = values;
  } else {
    data = new Kind(values.length);
    const big = Kind === BigInt64Array || Kind === BigUint64Array;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (typeof v !== 'number' && typeof v !== 'bigint') {
        throw new TrainingPackageError(`${what} holds ${JSON.stringify(v)} at value ${i} (row ` +
          `${Math.floor(i / width)}); the package's ${JSON.stringify(spec.name)} takes ${dtype} numbers`);
      }
      data[i] = big ? BigInt(v) : Number(v);
    }
  }
  if (Kind === Float32Array || Kind === Float64Array) checkFinite(what, data, width);
  return {n, width, data};
}

function checkFinite(what, data, width) {
  for (let i = 0; i < data.length; i++) {
    if (!Number.isFinite(data[i])) {
      throw new TrainingPackageError(`${what} holds a non-finite value (${data[i]}) at row ` +
        `${Math.floor(i / width)}, column ${i % width}`);
    }
  }
}

/** Class labels as the float32 targets the package's loss reads (`binary`: 1 for classes[1]; `one_hot`). */
function encodeLabels(y, target) {
  const classes = target.classes;
  const textual = typeof classes[0] === 'string';
  const index = new Map(classes.map((c, i) => [textual ? c : Number(c), i]));
  const labels = isTensor(y) ? Array.from(y.data) : flattenRow(y, []);
  const n = labels.length;
  if (n === 0) throw new TrainingPackageError('y is empty: at least one label is needed');
  const oneHot = target.encoding === 'one_hot';
  const width = oneHot ? classes.length : 1;
  const data = new Float32Array(n * width);
  for (let i = 0; i < n; i++) {
    const label = labels[i];
    const key = textual ? label : (typeof label === 'bigint' ? Number(label) : label);
    const k = (textual ? typeof label === 'string' : typeof key === 'number') ? index.get(key) : undefined;
    if (k === undefined) {
      throw new TrainingPackageError(`y holds the label ${JSON.stringify(typeof label === 'bigint' ? String(label) :
        label)} (row ${i}), which is not among the package's classes ${JSON.stringify(classes)}`);
    }
    if (oneHot) data[i * width + k] = 1;
    else data[i] = k === 1 ? 1 : 0;
  }
  return {n, width, data};
}

function targetsOf(y, target) {
  if (target.encoding === 'binary' || target.encoding === 'one_hot') return encodeLabels(y, target);
  if (target.encoding !== 'value') {
    throw new TrainingPackageError(`the package's target encoding ${JSON.stringify(target.encoding)} is not one ` +
      'of ["value", "binary", "one_hot"]');
  }
  const width = target.shape.length > 1 ? rowWidth(target.shape) : 1;
  return columnOf('y', target, y, width);
}

function tensorFor(ort, dtype, data, dims) {
  return new ort.Tensor(ORT_TYPES[dtype] || dtype, data, dims);
}

// --- the trainer --------------------------------------------------------------------------------------------

/** A training package loaded on a runtime: train it (`fit`), predict, export the state or the trained graph. */
export class Trainer {
  constructor(ort, manifest, files, stepSession, sessionOptions, flat, unrolled = []) {
    this.ort = ort;
    this.manifest = manifest;
    this._files = files;
    this._step = stepSession;
    this._sessionOptions = sessionOptions;
    /** whether steps run step_flat.onnx (the whole state as one vector) rather than step.onnx */
    this.flat = flat;
    /** the unrolled step graphs fit runs for runs of full batches (the manifest's `unrolled`), by steps: K -> entry */
    this.unrolled = new Map(unrolled.map((u) => [u.steps, u]));
    this._unrolledSessions = new Map();
    this._predict = null;
    const m = manifest;
    const stateBytes = files[m.state.file];
    if (stateBytes.length !== m.state.bytes) {
      throw new TrainingPackageError(`${m.state.file} has ${stateBytes.length} bytes, the manifest says ` +
        `${m.state.bytes}`);
    }
    /** every state tensor (weights, then optimizer slots) by name, float32 */
    this.tensors = unpackState(stateBytes, m.state.tensors, m.state.file);
    const progress = m.progress || {};
    this.epochs = progress.epochs || 0;
    this.steps = progress.steps || 0;
    this.rowsSeen = progress.rows_seen || 0;
    this.rows = 0;
    /** the runtime runs fit made so far (one per step, one per run of an unrolled graph) */
    this.runs = 0;
    this.history = [];
  }

  /**
   * The package at `source` (a folder path in Node, a URL in a browser) on the runtime `ort` (onnxruntime-node or
   * onnxruntime-web). Checks the format version and the SHA-256 of every file against the manifest.
   * `sessionOptions` go to `ort.InferenceSession.create` (default: one thread, the runtime's CPU engine).
   * `flat` ('auto', true, false): run step_flat.onnx (the state as one vector) rather than step.onnx; `unrolled`
   * (default true, with flat): run K full batches at once by the package's steps_<K>.onnx where it has them.
   */
  static async load(source, {ort, sessionOptions, flat = 'auto', unrolled = true} = {}) {
    if (!ort || !ort.InferenceSession || !ort.Tensor) {
      throw new TrainingPackageError('Trainer.load needs {ort}: the onnxruntime-node or onnxruntime-web module');
    }
    const reader = await fileReader(source);
    const manifestBytes = await reader.read('manifest.json');
    let manifest;
    try {
      manifest = JSON.parse(new TextDecoder().decode(manifestBytes));
    } catch (err) {
      throw new TrainingPackageError(`manifest.json of the package ${reader.where} is not JSON: ${err.message}`);
    }
    checkManifest(manifest, reader.where);
    const names = Object.keys(manifest.files || {});
    for (const needed of [manifest.step.file, manifest.predict.file, manifest.state.file]) {
      if (!names.includes(needed)) {
        throw new TrainingPackageError(`the manifest of ${reader.where} lists no checksum for ${needed}`);
      }
    }
    const files = {};
    await Promise.all(names.map(async (name) => {
      const bytes = await reader.read(name);
      const expected = manifest.files[name].sha256;
      const actual = await sha256Hex(bytes);
      if (actual !== expected) {
        throw new TrainingPackageError(`${name} of the package ${reader.where} does not match the manifest's ` +
          `checksum (SHA-256 ${actual}, the manifest says ${expected})`);
      }
      files[name] = bytes;
    }));
    const onNode = !!(ort.env && ort.env.versions && ort.env.versions.node);
    const options = {executionProviders: [onNode ? 'cpu' : 'wasm'], intraOpNumThreads: 1, interOpNumThreads: 1,
      ...(sessionOptions || {})};
    if (flat === true && !manifest.step_flat) {
      throw new TrainingPackageError(`the package ${reader.where} has no step_flat graph (flat: true was asked)`);
    }
    const useFlat = flat === 'auto' ? !!manifest.step_flat : flat === true;
    if (useFlat && !names.includes(manifest.step_flat.file)) {
      throw new TrainingPackageError(`the manifest of ${reader.where} lists no checksum for ` +
        manifest.step_flat.file);
    }
    const step = await ort.InferenceSession.create(files[useFlat ? manifest.step_flat.file : manifest.step.file],
      options);
    const ladder = useFlat && unrolled ? (manifest.unrolled || []) : [];
    for (const u of ladder) {
      if (!names.includes(u.file)) {
        throw new TrainingPackageError(`the manifest of ${reader.where} lists no checksum for ${u.file}`);
      }
    }
    return new Trainer(ort, manifest, files, step, options, useFlat, ladder);
  }

  /** The package's id (the SHA-256 of its step graph): a state names the package it was trained from with it. */
  get packageId() {
    return this.manifest.package_id;
  }

  /** The trained weights (no optimizer slot) by name. */
  get weights() {
    return Object.fromEntries(this.manifest.state.weights.map((w) => [w, this.tensors[w]]));
  }

  /** The package's data inputs fed from X: {name: {n, width, data}}. */
  _dataColumns(X) {
    const inputs = this.manifest.data_inputs;
    let given;
    if (inputs.length === 1 && (Array.isArray(X) || ArrayBuffer.isView(X) || isTensor(X))) {
      given = {[inputs[0].name]: X};
    } else if (X && typeof X === 'object' && !Array.isArray(X)) {
      given = X;
    } else {
      throw new TrainingPackageError(`X must give the inputs ${JSON.stringify(inputs.map((i) => i.name))}`);
    }
    const wanted = inputs.map((i) => i.name);
    const extra = Object.keys(given).filter((k) => !wanted.includes(k));
    const missing = wanted.filter((k) => !(k in given));
    if (extra.length || missing.length) {
      throw new TrainingPackageError(`X must give the inputs ${JSON.stringify(wanted)}` +
        (missing.length ? `; missing ${JSON.stringify(missing)}` : '') +
        (extra.length ? `; unknown ${JSON.stringify(extra)}` : ''));
    }
    const columns = {};
    for (const spec of inputs) {
      columns[spec.name] = {spec, ...columnOf(inputs.length === 1 ? 'X' : `X (${JSON.stringify(spec.name)})`,
        spec, given[spec.name])};
    }
    return columns;
  }

  /**
   * Train for `epochs` epochs from the current state, as Python's `train_package`: each epoch's learning rate from
   * the schedule at the rows seen before it, its row order `epochOrder(n, seed, epochs completed)` (or the rows as
   * given without `shuffle`), batches of the package's batch size (the last one shorter), `step` counting the
   * updates. `onEpoch({epoch, loss, learningRate, steps, rowsSeen})` is awaited after each epoch.
   */
  async fit(X, y, {epochs = 1, shuffle = true, seed = 0, sampleWeight, onEpoch} = {}) {
    const m = this.manifest;
    const ort = this.ort;
    if (!Number.isInteger(epochs) || epochs < 0) {
      throw new TrainingPackageError(`epochs=${JSON.stringify(epochs)} must be an integer >= 0`);
    }
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
      throw new TrainingPackageError(`seed=${JSON.stringify(seed)} must be an unsigned 32-bit integer`);
    }
    const columns = this._dataColumns(X);
    const n = Object.values(columns)[0].n;
    for (const [name, c] of Object.entries(columns)) {
      if (c.n !== n) throw new TrainingPackageError(`X (${JSON.stringify(name)}) has ${c.n} rows, another has ${n}`);
    }
    const target = targetsOf(y, m.target);
    if (target.n !== n) throw new TrainingPackageError(`y has ${target.n} rows, X has ${n}`);
    columns[m.target.name] = {spec: m.target, ...target};
    if (m.sample_weight) {
      const spec = m.step.inputs.find((i) => i.name === m.sample_weight);
      const w = sampleWeight === undefined || sampleWeight === null ? {n, width: 1, data: new Float32Array(n).fill(1)} :
        columnOf('sampleWeight', {...spec, dtype: 'float32'}, sampleWeight, 1);
      if (w.n !== n) throw new TrainingPackageError(`sampleWeight has ${w.n} rows, X has ${n}`);
      columns[m.sample_weight] = {spec, ...w};
    } else if (sampleWeight !== undefined && sampleWeight !== null) {
      throw new TrainingPackageError('sampleWeight was given but the package\'s graph has no weight input');
    }
    const batchSize = m.batch_size;
    const names = m.state.tensors.map((t) => t.name);
    const shapes = Object.fromEntries(m.state.tensors.map((t) => [t.name, t.shape]));
    const readsStep = m.optimizer.reads_step;
    const lossName = m.step.outputs[0].name;
    const maxSteps = Math.max(1, ...this.unrolled.keys());
    const batched = Object.entries(columns).map(([name, c]) => ({
      name, c, dtype: c.spec.dtype,
      dims: (rows) => [rows, ...(c.spec.shape.length > 1 ? c.spec.shape.slice(1) : [])],
      gather: c.data.constructor === Array ? null : new c.data.constructor(maxSteps * batchSize * c.width),
    }));
    // the state fed to the step: one vector (step_flat.onnx, state.bin's layout) or one tensor per state tensor
    const flat = this.flat ? m.step_flat : null;
    let state = flat ? {[flat.state_input]: tensorFor(ort, 'float32', this._stateVector(), [this._stateLength()])} :
      Object.fromEntries(names.map((k) => [k, tensorFor(ort, 'float32', this.tensors[k], shapes[k])]));
    try {
      for (let e = 0; e < epochs; e++) {
        const rate = learningRateAt(m.schedule, this.rowsSeen);
        const rateTensor = tensorFor(ort, 'float32', Float32Array.of(rate), []);
        const order = shuffle ? epochOrder(n, seed, this.epochs) : null;
        let total = 0;
        let start = 0;
        let singleUntil = 0; // a run of the unrolled graph with a non-finite loss goes again one step at a time
        while (start < n) {
          const count = start >= singleUntil ? this._unrolledCount(n - start, batchSize) : 0;
          if (count) {
            const entry = this.unrolled.get(count);
            const session = await this._unrolledSession(count);
            const rows = count * batchSize;
            const feeds = {...state};
            for (const b of batched) {
              feeds[b.name] = tensorFor(ort, b.dtype, batchRows(b, order, start, rows), b.dims(rows));
            }
            feeds.learning_rate = rateTensor;
            if (readsStep) feeds.step = tensorFor(ort, 'float32', Float32Array.of(this.steps + 1), []);
            const out = await session.run(feeds);
            this.runs += 1;
            const losses = out[entry.losses_output].data;
            if (!losses.every((l) => Number.isFinite(l))) {
              singleUntil = start + rows;
              continue;
            }
            state = {[flat.state_input]: out[entry.state_output]};
            for (const l of losses) total += l * batchSize;
            this.steps += count;
            start += rows;
            continue;
          }
          const rows = Math.min(batchSize, n - start);
          const feeds = {...state};
          for (const b of batched) {
            feeds[b.name] = tensorFor(ort, b.dtype, batchRows(b, order, start, rows), b.dims(rows));
          }
          feeds.learning_rate = rateTensor;
          if (readsStep) feeds.step = tensorFor(ort, 'float32', Float32Array.of(this.steps + 1), []);
          const out = await this._step.run(feeds);
          this.runs += 1;
          const loss = Number(out[lossName].data[0]);
          if (!Number.isFinite(loss)) {
            throw new TrainingPackageError(`the training loss is ${loss} at epoch ${this.epochs + 1}, step ` +
              `${this.steps + 1} (batch ${start / batchSize + 1}): training stopped, the state is the one before ` +
              'this step');
          }
          if (flat) {
            state = {[flat.state_input]: out[flat.state_output]};
          } else {
            const next = {};
            for (const k of names) next[k] = out[`${k}_updated`];
            state = next;
          }
          this.steps += 1;
          total += loss * rows;
          start += rows;
        }
        this.rowsSeen += n;
        this.epochs += 1;
        this.rows = n;
        this._keep(state);
        const record = {epoch: this.epochs, loss: total / n, learningRate: Math.fround(rate), steps: this.steps,
          rowsSeen: this.rowsSeen};
        this.history.push(record);
        if (onEpoch) await onEpoch(record);
      }
    } finally {
      this._keep(state);
    }
    return this;
  }

  /** The steps of the largest unrolled graph that fits the full batches of `rowsLeft` rows; 0 if none. */
  _unrolledCount(rowsLeft, batchSize) {
    let best = 0;
    for (const k of this.unrolled.keys()) if (k * batchSize <= rowsLeft && k > best) best = k;
    return best;
  }

  async _unrolledSession(count) {
    if (!this._unrolledSessions.has(count)) {
      this._unrolledSessions.set(count, await this.ort.InferenceSession.create(
        this._files[this.unrolled.get(count).file], this._sessionOptions));
    }
    return this._unrolledSessions.get(count);
  }

  _stateLength() {
    return this.manifest.state.tensors.reduce((total, t) => total + t.length, 0);
  }

  /** The state tensors one after the other (state.bin's layout), as step_flat.onnx takes them. */
  _stateVector() {
    const vector = new Float32Array(this._stateLength());
    for (const t of this.manifest.state.tensors) vector.set(this.tensors[t.name], t.offset / 4);
    return vector;
  }

  _keep(state) {
    if (this.flat) {
      const vector = state[this.manifest.step_flat.state_input].data;
      if (this._vector === vector) return;
      this._vector = vector;
      this._predict = null;
      for (const t of this.manifest.state.tensors) {
        this.tensors[t.name] = vector.subarray(t.offset / 4, t.offset / 4 + t.length);
      }
      return;
    }
    for (const [k, t] of Object.entries(state)) {
      if (this.tensors[k] !== t.data) {
        this.tensors[k] = t.data instanceof Float32Array ? t.data : Float32Array.from(t.data);
        this._predict = null;
      }
    }
  }

  /** The trained prediction graph's outputs for X: {outputName: ort.Tensor}. */
  async run(X) {
    if (!this._predict) {
      this._predict = await this.ort.InferenceSession.create(this.exportModel(), this._sessionOptions);
    }
    const columns = this._dataColumns(X);
    const feeds = {};
    for (const [name, c] of Object.entries(columns)) {
      const spec = this.manifest.predict.inputs.find((i) => i.name === name) || c.spec;
      feeds[name] = tensorFor(this.ort, c.spec.dtype, c.data, [c.n, ...spec.shape.slice(1).map((d, i) =>
        (typeof d === 'number' ? d : c.spec.shape[i + 1]))]);
    }
    return this._predict.run(feeds);
  }

  /**
   * The trained graph's first output for X as plain values: one value per row (a class label, a number) or one
   * array per row (scores of several columns). `run(X)` gives every output as tensors.
   */
  async predict(X) {
    const outputs = await this.run(X);
    const first = this.manifest.predict.outputs[0].name;
    return plainRows(outputs[first]);
  }

  /** The state file (`OFTS`, header length, JSON header, float32 data): what Python's `load_training_state` reads. */
  exportState() {
    const m = this.manifest;
    let offset = 0;
    const table = m.state.tensors.map((t) => {
      const entry = {name: t.name, shape: t.shape, offset, length: t.length};
      offset += 4 * t.length;
      return entry;
    });
    const header = {format: STATE_FORMAT, format_version: FORMAT_VERSION, package_id: m.package_id,
      tensors: table, epochs: this.epochs, steps: this.steps, rows_seen: this.rowsSeen, rows: this.rows};
    let json = new TextEncoder().encode(JSON.stringify(header));
    const padded = new Uint8Array(Math.ceil(json.length / 4) * 4).fill(0x20);
    padded.set(json);
    json = padded;
    const out = new Uint8Array(8 + json.length + offset);
    out.set(STATE_MAGIC, 0);
    new DataView(out.buffer).setUint32(4, json.length, true);
    out.set(json, 8);
    for (const t of table) writeFloat32(out, 8 + json.length + t.offset, this.tensors[t.name]);
    return out;
  }

  /** The trained prediction graph (ONNX bytes, weights inside): the package's graph with these weights written over
   * their byte ranges. Any ONNX runtime runs it. */
  exportModel() {
    const m = this.manifest;
    const out = new Uint8Array(this._files[m.predict.file]);
    for (const patch of m.predict.weights) {
      const values = this.tensors[patch.name];
      if (!values || 4 * values.length !== patch.bytes) {
        throw new TrainingPackageError(`weight ${JSON.stringify(patch.name)} of the prediction graph takes ` +
          `${patch.bytes} bytes; the state has ${values ? 4 * values.length : 'no such tensor'}`);
      }
      writeFloat32(out, patch.offset, values);
    }
    return out;
  }
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

const LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;

function writeFloat32(bytes, offset, values) {
  if (LITTLE_ENDIAN) {
    bytes.set(new Uint8Array(values.buffer, values.byteOffset, 4 * values.length), offset);
    return;
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  for (let i = 0; i < values.length; i++) view.setFloat32(offset + 4 * i, values[i], true);
}

function readFloat32(bytes, offset, length) {
  const out = new Float32Array(length);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < length; i++) out[i] = view.getFloat32(offset + 4 * i, true);
  return out;
}

function unpackState(bytes, table, what) {
  const tensors = {};
  for (const t of table) {
    if (t.offset + 4 * t.length > bytes.length) {
      throw new TrainingPackageError(`${what} is truncated: ${JSON.stringify(t.name)} ends at byte ` +
        `${t.offset + 4 * t.length}, the file has ${bytes.length}`);
    }
    tensors[t.name] = readFloat32(bytes, t.offset, t.length);
    checkFinite(`${what} (${JSON.stringify(t.name)})`, tensors[t.name], 1);
  }
  return tensors;
}

function plainRows(tensor) {
  const data = Array.from(tensor.data, (v) => (typeof v === 'bigint' ? Number(v) : v));
  const n = tensor.dims.length ? tensor.dims[0] : 1;
  const width = n ? data.length / n : 0;
  if (width === 1) return data;
  return Array.from({length: n}, (_, i) => data.slice(i * width, (i + 1) * width));
}
