// Typings of ortflow's JavaScript trainer: the browser entry (index.js) and the Node entry (node.js, the same API; it
// also reads a package from a folder). The runtime is passed in: onnxruntime-node or onnxruntime-web.
// TypeScript 5.7 or later (`Uint8Array<ArrayBuffer>`).

// --- the runtime ------------------------------------------------------------------------------------------------
/** The part of an onnxruntime module (onnxruntime-node, onnxruntime-web) the trainer uses. */
export interface OrtRuntime {
  InferenceSession: {create(model: Uint8Array, options?: object): Promise<OrtSession>};
  Tensor: new (type: string, data: unknown, dims?: readonly number[]) => OrtTensor;
  env?: {versions?: {node?: string; web?: string}; wasm?: object};
}

export interface OrtSession {
  run(feeds: Record<string, OrtTensor>): Promise<Record<string, OrtTensor>>;
  release?(): Promise<void>;
}

/** A runtime tensor (ort.Tensor of either runtime). */
export interface OrtTensor {
  readonly type: string;
  readonly dims: readonly number[];
  readonly data: ArrayLike<number | bigint | string>;
}

// --- data -------------------------------------------------------------------------------------------------------
/** One value, or a row of values (nested arrays are flattened: an image row may be [[...], ...]). */
export type Row = number | bigint | string | ArrayLike<number> | Row[];
/** Rows of one input: an array of rows, or a runtime tensor whose first axis is the rows. */
export type Rows = Row[] | OrtTensor;
/** The rows of the package's data input, or `{inputName: rows}` for a graph of several data inputs. */
export type Features = Rows | Record<string, Rows>;

// --- the format -------------------------------------------------------------------------------------------------
export const FORMAT: 'ortflow-training-package';
export const FORMAT_VERSION: 1;
export const STATE_FORMAT: 'ortflow-training-state';
export const GENERATOR: 'mulberry32-fisher-yates';

/** A JSON value (what `manifest.metadata` holds). */
export type JsonValue = null | boolean | number | string | JsonValue[] | {[key: string]: JsonValue};

/** The standardization a package exported by the pipelines expects (`manifest.metadata.standardization`): features
 * fed as `(x - x_mean) / x_scale`, a regressor's target as `(y - y_mean) / y_scale`; null where none applies. */
export type Standardization = {
  x_mean: number[] | null;
  x_scale: number[] | null;
  y_mean: number[] | null;
  y_scale: number[] | null;
};

/** What the exporter added (`export_training_package(..., metadata=...)`): any JSON; the pipelines write
 * `standardization`, `task`, `features`, `model` and where the weights come from. */
export interface Metadata {
  [key: string]: JsonValue | undefined;
  standardization?: Standardization;
}

/** An input or output of a graph: a shape lists sizes and the batch axis's symbol (`"batch"`, or null). */
export interface TensorInfo {
  name: string;
  shape: Array<number | string | null>;
  dtype: string;
  /** inputs of the step graph: `data`, `target`, `sample_weight`, `weight`, `slot`, `learning_rate`, `step`,
   * `state` */
  role?: string;
}

/** A step graph of the manifest (`step`, `step_flat`, an `unrolled[i]`). */
export interface GraphEntry {
  file: string;
  inputs: TensorInfo[];
  outputs: TensorInfo[];
  /** step_flat and unrolled graphs: the state vector's input and output */
  state_input?: string;
  state_output?: string;
  /** unrolled graphs: the output of the K losses */
  losses_output?: string;
}

/** `manifest.json` of a training package (docs/TRAINING_OUTSIDE_PYTHON.md in the repository). The library checks it
 * against the format's JSON Schema when it loads a package. */
export interface Manifest {
  format: 'ortflow-training-package';
  format_version: 1;
  /** the SHA-256 of step.onnx: a state names the package it was trained from with it */
  package_id: string;
  batch_size: number;
  step: GraphEntry;
  step_flat?: GraphEntry;
  unrolled?: Array<GraphEntry & {steps: number; rows: number}>;
  data_inputs: TensorInfo[];
  feature_names: string[] | null;
  target: TensorInfo & {classes: Array<string | number> | null; encoding: 'value' | 'binary' | 'one_hot'};
  sample_weight: string | null;
  schedule: Schedule;
  state: {
    file: string;
    bytes: number;
    tensors: Array<{name: string; shape: number[]; dtype: string; offset: number; length: number}>;
    weights: string[];
  };
  progress: {epochs: number; steps: number; rows_seen: number};
  metadata: Metadata;
  [key: string]: unknown;
}

/** What is wrong with a package, a state or the data given to train it (the message names the field, the file,
 * the row and column). */
export class TrainingPackageError extends Error {
  name: 'TrainingPackageError';
}

/** `fit` was called while another `fit` of the same trainer runs. */
export class ConcurrentFitError extends Error {
  name: 'ConcurrentFitError';
}

/** A non-finite training loss; the trainer keeps the state before the step that produced it. */
export class ConvergenceError extends Error {
  name: 'ConvergenceError';
  /** the epoch (1-based, over the state's whole life) and the step (1-based: the update that failed) */
  readonly epoch: number;
  readonly step: number;
  /** the batch of the epoch (from 0) */
  readonly batch: number;
}

// --- shuffling and schedules (the same numbers as Python's ortflow.shuffle and ortflow.schedules) -----------------
/** The shuffle generator's 32-bit state for (seed, epoch). */
export function seedState(seed: number, epoch: number): number;
/** mulberry32: successive unsigned 32-bit draws from a 32-bit state. */
export function mulberry32(state: number): () => number;
/** The row order of `epoch` (epochs completed before, from 0) for `seed`: Python's `ortflow.shuffle.epoch_order`. */
export function epochOrder(n: number, seed: number, epoch: number): Int32Array;

export interface Schedule {
  name: 'constant' | 'invscaling' | 'optimal' | 'optimal_sklearn';
  eta0: number;
  power_t: number;
  alpha: number;
}
/** The learning rate of an epoch starting after `rowsSeen` rows (`ortflow.schedules.learning_rate_at`). */
export function learningRateAt(schedule: Schedule, rowsSeen: number): number;

// --- training ---------------------------------------------------------------------------------------------------
/** What `fit` reports after an epoch (`onEpochEnd`): the numbers of Python's `on_epoch` record (`rowsSeen` for
 * `rows_seen`, `learningRate` for `learning_rate`). */
export interface Logs {
  /** the epoch's mean training loss over its rows */
  loss: number;
  /** the mean loss on the validation rows (`validationData` or `validationSplit`), after each epoch */
  val_loss?: number;
  /** optimizer updates so far, over the state's whole life */
  steps: number;
  /** rows trained so far, all epochs */
  rowsSeen: number;
  /** the epoch's learning rate, as fed (float32) */
  learningRate: number;
}

/** What `fit` reports after a batch (`onBatchEnd`). */
export interface BatchLogs {
  /** the batch's mean loss */
  loss: number;
  /** the batch's rows */
  size: number;
  steps: number;
  learningRate: number;
}

/** TensorFlow.js's callbacks: each may return a promise, which `fit` awaits. `epoch` counts the epochs of the
 * state's whole life from 0 (`history.epoch`), `batch` the batches of the epoch from 0. */
export interface Callbacks {
  onTrainBegin?(): void | Promise<void>;
  onEpochEnd?(epoch: number, logs: Logs): void | Promise<void>;
  onBatchEnd?(batch: number, logs: BatchLogs): void | Promise<void>;
  /** the last epoch's logs (undefined when no epoch ran) */
  onTrainEnd?(logs?: Logs): void | Promise<void>;
}

/** The record of the deprecated `onEpoch` callback. */
export interface EpochRecord {
  /** epochs completed, this one included (counted over the state's whole life) */
  epoch: number;
  loss: number;
  learningRate: number;
  steps: number;
  rowsSeen: number;
}

/** What `fit` returns (TensorFlow.js's shape): the epochs it trained and their losses. */
export interface History {
  epoch: number[];
  history: {loss: number[]; val_loss?: number[]};
}

export interface FitOptions {
  /** epochs to train (default 1) */
  epochs?: number;
  /** shuffle each epoch's rows with the package's generator (default true) */
  shuffle?: boolean;
  /** the generator's seed, an unsigned 32-bit integer (default 0) */
  seed?: number;
  /** one weight per row, when the package's graph takes sample weights (default 1 for every row) */
  sampleWeight?: Rows;
  /** the package's graphs fix the batch size: only `manifest.batch_size` is accepted (RangeError otherwise) */
  batchSize?: number;
  callbacks?: Callbacks;
  /** @deprecated use `callbacks.onEpochEnd` */
  onEpoch?: (record: EpochRecord) => void | Promise<void>;
  /** stops training between steps once aborted (so does `trainer.stopTraining = true`) */
  signal?: AbortSignal;
  /** rows whose loss is reported as `val_loss` after each epoch: `[X, y]` or `[X, y, sampleWeight]` */
  validationData?: [Features, Rows] | [Features, Rows, Rows];
  /** the fraction (0 to 1) of the rows, taken from the end before shuffling, kept for `val_loss` */
  validationSplit?: number;
}

export interface LoadOptions {
  /** onnxruntime-node or onnxruntime-web */
  ort: OrtRuntime;
  /** passed to `ort.InferenceSession.create` (default: one thread, 'cpu' on Node's runtime, 'wasm' on the web's) */
  sessionOptions?: object;
  /** the execution providers to try in order, e.g. `['webgpu', 'wasm']` */
  executionProviders?: string[];
  /** run step_flat.onnx (the whole state as one vector in and out) rather than step.onnx; 'auto' (default): when
   * the package has it */
  flat?: boolean | 'auto';
  /** with flat: run K full batches at once by the package's unrolled graphs steps_<K>.onnx (default true) */
  unrolled?: boolean;
}

/** Bad arguments throw `TypeError` (a wrong type) or `RangeError` (a value out of range); bad data and packages
 * `TrainingPackageError`. After `dispose()` every call throws. */
export class Trainer {
  /** Loads the package at `source` (a URL, or a folder path with the Node entry), checking the manifest, its format
   * version and the SHA-256 of every file; files outside the package are refused. */
  static load(source: string | URL, options: LoadOptions): Promise<Trainer>;

  readonly manifest: Manifest;
  /** the runtime passed to `load` */
  readonly ort: OrtRuntime;
  /** where the package was read from (in messages) */
  readonly where: string;
  /** every state tensor (weights, then optimizer slots) by name */
  readonly tensors: Record<string, Float32Array>;
  /** the trained weights by name */
  readonly weights: Record<string, Float32Array>;
  readonly packageId: string;
  /** whether steps run step_flat.onnx */
  readonly flat: boolean;
  /** the unrolled step graphs fit uses, by their number of steps (empty: one step per run) */
  readonly unrolled: Map<number, GraphEntry & {steps: number; rows: number}>;
  /** the runtime runs fit made so far (one per step, one per run of an unrolled graph) */
  readonly runs: number;
  /** progress of the state, continued across fit() calls */
  readonly epochs: number;
  readonly steps: number;
  readonly rowsSeen: number;
  /** rows of the data of the last fit (the state's weight when states are averaged) */
  readonly rows: number;
  /** every epoch this trainer trained, over all `fit` calls (`epoch` from 1 over the state's whole life) */
  readonly history: Array<EpochRecord & {val_loss?: number}>;
  /** set to true (in a callback, or from elsewhere) to stop `fit` after the running step */
  stopTraining: boolean;

  /** X: rows of the package's data input (or {inputName: rows} for several); y: targets, or class labels. */
  fit(X: Features, y: Rows, options?: FitOptions): Promise<History>;
  /** The mean loss over the rows (the package's loss graph). */
  evaluate(X: Features, y: Rows, options?: {sampleWeight?: Rows}): Promise<number>;
  /** The trained graph's first output: one value per row (label, number) or one array of scores per row. */
  predict(X: Features): Promise<Array<number | string | number[]>>;
  /** Every output of the trained graph as tensors. */
  run(X: Features): Promise<Record<string, OrtTensor>>;
  /** The state file Python's `ortflow.load_training_state(folder, state)` reads; a `BlobPart` and a `fetch` body. */
  exportState(): Uint8Array<ArrayBuffer>;
  /** Continues from a state file of this package (from `exportState()`, or Python's `TrainingState.to_bytes()`). */
  loadState(bytes: Uint8Array | ArrayBuffer): this;
  /** The trained prediction graph (ONNX bytes, weights inside). */
  exportModel(): Uint8Array<ArrayBuffer>;
  /** Releases every session; any later call throws. */
  dispose(): Promise<void>;
}
