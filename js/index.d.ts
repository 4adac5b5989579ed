// Typings of ortflow's JavaScript trainer (index.js). The runtime is passed in: onnxruntime-node or onnxruntime-web.

/** The part of an onnxruntime module (onnxruntime-node, onnxruntime-web) the trainer uses. */
export interface OrtRuntime {
  InferenceSession: {create(model: Uint8Array, options?: object): Promise<OrtSession>};
  Tensor: new (type: string, data: unknown, dims?: readonly number[]) => OrtTensor;
  env?: {versions?: {node?: string; web?: string}; wasm?: object};
}

export interface OrtSession {
  run(feeds: Record<string, OrtTensor>): Promise<Record<string, OrtTensor>>;
}

/** A runtime tensor (ort.Tensor of either runtime). */
export interface OrtTensor {
  readonly type: string;
  readonly dims: readonly number[];
  readonly data: ArrayLike<number | bigint | string>;
}

/** One value, or a row of values (nested arrays are flattened: an image row may be [[...], ...]). */
export type Row = number | bigint | string | ArrayLike<number> | Row[];
/** Rows of one input: an array of rows, or a runtime tensor whose first axis is the rows. */
export type Rows = Row[] | OrtTensor;

export const FORMAT: 'ortflow-training-package';
export const FORMAT_VERSION: 1;
export const STATE_FORMAT: 'ortflow-training-state';
export const GENERATOR: 'mulberry32-fisher-yates';

/** What is wrong with a package, a state or the data given to train it. */
export class TrainingPackageError extends Error {
  name: 'TrainingPackageError';
}

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

export interface EpochRecord {
  /** epochs completed, this one included (counted over the state's whole life) */
  epoch: number;
  /** mean training loss of the epoch's batches, weighted by their rows */
  loss: number;
  /** the epoch's learning rate, as fed (float32) */
  learningRate: number;
  /** optimizer updates so far */
  steps: number;
  /** rows trained so far, all epochs */
  rowsSeen: number;
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
  /** awaited after each epoch */
  onEpoch?: (record: EpochRecord) => void | Promise<void>;
}

export interface LoadOptions {
  /** onnxruntime-node or onnxruntime-web */
  ort: OrtRuntime;
  /** passed to `ort.InferenceSession.create` (default: one thread, 'cpu' on Node's runtime, 'wasm' on the web's) */
  sessionOptions?: object;
  /** run step_flat.onnx (the whole state as one vector in and out) rather than step.onnx; 'auto' (default): when
   * the package has it */
  flat?: boolean | 'auto';
  /** with flat: run K full batches at once by the package's unrolled graphs steps_<K>.onnx (default true) */
  unrolled?: boolean;
}

export interface Manifest {
  format: 'ortflow-training-package';
  format_version: 1;
  package_id: string;
  batch_size: number;
  [key: string]: unknown;
}

export class Trainer {
  /** Loads the package at `source` (a folder path in Node, a URL in a browser), checking its format version and
   * the SHA-256 of every file. */
  static load(source: string | URL, options: LoadOptions): Promise<Trainer>;

  readonly manifest: Manifest;
  /** every state tensor (weights, then optimizer slots) by name */
  readonly tensors: Record<string, Float32Array>;
  /** the trained weights by name */
  readonly weights: Record<string, Float32Array>;
  readonly packageId: string;
  /** whether steps run step_flat.onnx */
  readonly flat: boolean;
  /** the unrolled step graphs fit uses, by their number of steps (empty: one step per run) */
  readonly unrolled: Map<number, {file: string; steps: number; rows: number}>;
  /** the runtime runs fit made so far (one per step, one per run of an unrolled graph) */
  readonly runs: number;
  /** progress of the state, continued across fit() calls */
  readonly epochs: number;
  readonly steps: number;
  readonly rowsSeen: number;
  /** rows of the data of the last fit (the state's weight when states are averaged) */
  readonly rows: number;
  readonly history: EpochRecord[];

  /** X: rows of the package's data input (or {inputName: rows} for several); y: targets, or class labels. */
  fit(X: Rows | Record<string, Rows>, y: Rows, options?: FitOptions): Promise<this>;
  /** The trained graph's first output: one value per row (label, number) or one array of scores per row. */
  predict(X: Rows | Record<string, Rows>): Promise<Array<number | string | number[]>>;
  /** Every output of the trained graph as tensors. */
  run(X: Rows | Record<string, Rows>): Promise<Record<string, OrtTensor>>;
  /** The state file Python's `ortflow.load_training_state(folder, state)` reads. */
  exportState(): Uint8Array;
  /** The trained prediction graph (ONNX bytes, weights inside). */
  exportModel(): Uint8Array;
}
