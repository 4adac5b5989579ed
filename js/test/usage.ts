// What the examples and README.md do, in TypeScript: type-checked by `tsc --noEmit --strict` against index.d.ts
// (tests/test_js_package.py: in js/, and in a new project that installed the packed tarball beside onnxruntime-web).
// Never run.
import * as ort from 'onnxruntime-web/wasm';
import {
  ConcurrentFitError, ConvergenceError, Trainer, TrainingPackageError, type Cell, type History, type Logs,
  type Standardization, type TableRows,
} from 'ortflow';

ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = '/ort/';

/** Standardize rows as the package's metadata says (a pipelines-exported package). */
function standardize(X: number[][], s: Standardization | undefined): number[][] {
  if (!s?.x_mean || !s.x_scale) return X;
  const [mean, scale] = [s.x_mean, s.x_scale];
  return X.map((row) => row.map((v, j) => (v - mean[j]) / scale[j]));
}

export async function trainAndSendBack(packageUrl: string, X: number[][], y: Array<number | string>,
                                       postUrl: string): Promise<History> {
  const trainer = await Trainer.load(new URL(packageUrl, location.href), {ort, executionProviders: ['wasm']});
  const task = trainer.manifest.metadata?.task;  // any JSON value
  if (typeof task === 'string') console.log(task, trainer.manifest.batch_size, trainer.packageId);
  const rows = standardize(X, trainer.manifest.metadata?.standardization);
  const controller = new AbortController();
  const losses: number[] = [];
  const history = await trainer.fit(rows, y, {
    epochs: 5, seed: 0, shuffle: true, validationSplit: 0.2, signal: controller.signal,
    callbacks: {
      onTrainBegin: () => console.log('start'),
      onEpochEnd: (epoch: number, logs: Logs) => { losses.push(logs.loss); console.log(epoch, logs.val_loss); },
      onBatchEnd: async (batch, logs) => { if (logs.loss > 1e6) trainer.stopTraining = true; },
      onTrainEnd: () => console.log('done'),
    },
  });
  const last: number = history.history.loss[history.history.loss.length - 1];
  const validation: number | undefined = history.history.val_loss?.[0];
  console.log(history.epoch, last, validation, await trainer.evaluate(rows, y));
  await trainer.fit(rows, y, {validationData: [rows.slice(0, 4), y.slice(0, 4)]});
  await trainer.fit(rows, y, {batchSize: trainer.manifest.batch_size});
  // @ts-expect-error fit calls no onEpochBegin (it refuses unknown callbacks)
  await trainer.fit(rows, y, {callbacks: {onEpochBegin: () => undefined}});
  // @ts-expect-error the state is bytes
  const text: string = trainer.exportState();

  // the state as a download, a POST body, a message to the page (transferred)
  const state = trainer.exportState();
  const link = document.createElement('a');
  link.href = URL.createObjectURL(new Blob([state], {type: 'application/octet-stream'}));
  const response = await fetch(postUrl, {method: 'POST', body: trainer.exportState()});
  if (!response.ok) throw new Error(`POST ${postUrl}: HTTP ${response.status}`);
  postMessage({state}, {transfer: [state.buffer]});
  new Blob([trainer.exportModel()]);

  // resume from a state file, predict, release the sessions
  trainer.loadState(await (await fetch(`${packageUrl}/trained.state`)).arrayBuffer());
  trainer.loadState(new Uint8Array(8));
  const predictions = await trainer.predict(rows);
  console.log(predictions.length, trainer.weights, trainer.epochs, trainer.steps, trainer.rowsSeen);
  await trainer.dispose();
  return history;
}

/** A table's package trained on the rows a CSV parser gives (objects keyed by column name, cells as text). */
export async function trainOnTable(packageUrl: string, rows: Array<Record<string, string>>): Promise<number> {
  const trainer = await Trainer.load(packageUrl, {ort});
  const columns = Object.keys(trainer.manifest.preprocess?.columns ?? {});
  const prices = rows.map((row) => row.price);
  await trainer.fit(rows, prices, {epochs: 2, validationData: [rows.slice(0, 4), prices.slice(0, 4)]});
  const cells: Cell[][] = rows.map((row) => columns.map((name) => (row[name] === '' ? null : row[name])));
  const byColumn: TableRows = {sold: [new Date(), '2024-01-31', null], garden: [true, 'False', undefined]};
  await trainer.predict(cells);
  await trainer.run(byColumn).catch((err: unknown) => {
    if (err instanceof TrainingPackageError && err.row !== undefined) console.log(err.row, err.column);
  });
  return trainer.evaluate(rows, prices.map(Number));
}

export function explain(err: unknown): string {
  if (err instanceof ConvergenceError) return `diverged: ${err.message}`;
  if (err instanceof ConcurrentFitError) return 'a fit is running';
  if (err instanceof TrainingPackageError || err instanceof TypeError || err instanceof RangeError) return err.message;
  return String(err);
}
