// The data given to fit, evaluate and predict, as the flat typed arrays the package's inputs take: X (one array of
// rows, a tensor, or {inputName: rows}), y (targets, or class labels the package encodes), sampleWeight; each
// checked (rows of one width, finite numbers, known labels, weights >= 0) with an error naming the row.

import {TrainingPackageError} from './format.js';

export const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array, int16: Int16Array,
  int8: Int8Array, uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array, uint64: BigUint64Array,
};

export function isTensor(x) {
  return x !== null && typeof x === 'object' && Array.isArray(x.dims) && 'data' in x && typeof x.type === 'string';
}

function isRows(x) {
  return Array.isArray(x) || ArrayBuffer.isView(x);
}

function rowWidth(shape) {
  return shape.slice(1).reduce((a, d) => (typeof d === 'number' ? a * d : NaN), 1);
}

function flattenRow(row, out) {
  if (isRows(row)) {
    for (const v of row) flattenRow(v, out);
  } else {
    out.push(row);
  }
  return out;
}

/** The values of `given` (rows, or a tensor) one after the other, and the number of rows; refuses ragged rows. */
function flatRows(what, given, expected, describe) {
  if (isTensor(given)) return {n: given.dims.length ? given.dims[0] : 1, values: given.data};
  if (!isRows(given)) {
    throw new TypeError(`${what} must be an array of rows or a tensor, got ${given === null ? 'null' : typeof given}`);
  }
  const values = [];
  const widths = new Array(given.length);
  for (let r = 0; r < given.length; r++) {
    const before = values.length;
    flattenRow(given[r], values);
    widths[r] = values.length - before;
  }
  const wanted = Number.isFinite(expected) ? expected : widths[0];
  const bad = widths.findIndex((w) => w !== widths[0]) >= 0 ? widths.findIndex((w) => w !== wanted) : -1;
  if (bad >= 0) {
    throw new TrainingPackageError(`${what} is ragged: row ${bad} has ${widths[bad]} values, ` +
      (Number.isFinite(expected) ? `${describe} takes rows of ${expected}` : `row 0 has ${widths[0]}`));
  }
  return {n: given.length, values};
}

/** One input's rows as a flat typed array of the input's dtype: {n, width, data}. */
export function columnOf(what, spec, given, fixedWidth) {
  const dtype = spec.dtype;
  const Kind = ARRAYS[dtype];
  const expected = fixedWidth !== undefined ? fixedWidth : rowWidth(spec.shape);
  const describe = `the package's ${JSON.stringify(spec.name)}`;
  const {n, values} = flatRows(what, given, expected, describe);
  if (n === 0) throw new TrainingPackageError(`${what} is empty: at least one row is needed`);
  const width = values.length / n;
  if (!Number.isInteger(width) || (Number.isFinite(expected) && width !== expected)) {
    throw new TrainingPackageError(`${what} has ${values.length} values in ${n} rows; ${describe} takes rows of ` +
      `${expected} values (shape ${JSON.stringify(spec.shape)})`);
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

export function checkFinite(what, data, width) {
  for (let i = 0; i < data.length; i++) {
    if (!Number.isFinite(data[i])) {
      throw new TrainingPackageError(`${what} holds a non-finite value (${data[i]}) at row ` +
        `${Math.floor(i / width)}, column ${i % width}`);
    }
  }
}

/** Class labels as the float32 targets the package's loss reads (`binary`: 1 for classes[1]; `one_hot`). */
function encodeLabels(y, target, what) {
  const classes = target.classes;
  const textual = typeof classes[0] === 'string';
  const index = new Map(classes.map((c, i) => [textual ? c : Number(c), i]));
  const labels = flatRows(what, y, 1, 'a classifier').values;
  const n = labels.length;
  if (n === 0) throw new TrainingPackageError(`${what} is empty: at least one label is needed`);
  const oneHot = target.encoding === 'one_hot';
  const width = oneHot ? classes.length : 1;
  const data = new Float32Array(n * width);
  for (let i = 0; i < n; i++) {
    const label = labels[i];
    const key = textual ? label : (typeof label === 'bigint' ? Number(label) : label);
    const k = (textual ? typeof label === 'string' : typeof key === 'number') ? index.get(key) : undefined;
    if (k === undefined) {
      const shown = JSON.stringify(typeof label === 'bigint' ? String(label) : label);
      throw new TrainingPackageError(`${what} holds the label ${shown} (row ${i}), which is not among the package's ` +
        `classes ${JSON.stringify(classes)}`);
    }
    if (oneHot) data[i * width + k] = 1;
    else data[i] = k === 1 ? 1 : 0;
  }
  return {n, width, data};
}

/** The targets y as the package's target input takes them: {n, width, data}. */
export function targetsOf(y, target, what = 'y') {
  if (target.encoding === 'binary' || target.encoding === 'one_hot') return encodeLabels(y, target, what);
  if (target.encoding !== 'value') {
    throw new TrainingPackageError(`the package's target encoding ${JSON.stringify(target.encoding)} is not one ` +
      'of ["value", "binary", "one_hot"]');
  }
  const width = target.shape.length > 1 ? rowWidth(target.shape) : 1;
  return columnOf(what, target, y, width);
}

/** X as the columns of the data inputs `specs` ({name, shape, dtype}): [{spec, n, width, data}], one per input. */
export function dataColumns(specs, X, what = 'X') {
  let given;
  if (specs.length === 1 && (isRows(X) || isTensor(X))) {
    given = {[specs[0].name]: X};
  } else if (X && typeof X === 'object' && !isRows(X)) {
    given = X;
  } else {
    throw new TypeError(`${what} must give the inputs ${JSON.stringify(specs.map((i) => i.name))}` +
      (specs.length > 1 ? ' as an object {inputName: rows}' : ': an array of rows or a tensor'));
  }
  const wanted = specs.map((i) => i.name);
  const extra = Object.keys(given).filter((k) => !wanted.includes(k));
  const missing = wanted.filter((k) => !(k in given));
  if (extra.length || missing.length) {
    throw new TypeError(`${what} must give the inputs ${JSON.stringify(wanted)}` +
      (missing.length ? `; missing ${JSON.stringify(missing)}` : '') +
      (extra.length ? `; unknown ${JSON.stringify(extra)}` : ''));
  }
  const columns = specs.map((spec) => ({spec, ...columnOf(specs.length === 1 ? what : `${what} ` +
    `(${JSON.stringify(spec.name)})`, spec, given[spec.name])}));
  for (const c of columns) {
    if (c.n !== columns[0].n) {
      throw new TrainingPackageError(`${what} (${JSON.stringify(c.spec.name)}) has ${c.n} rows, ` +
        `${JSON.stringify(columns[0].spec.name)} has ${columns[0].n}`);
    }
  }
  return columns;
}

/** Sample weights as a float32 column of n rows (all 1 when not given), each finite and >= 0, not all 0. */
export function weightsOf(sampleWeight, spec, n, what = 'sampleWeight') {
  if (sampleWeight === undefined || sampleWeight === null) {
    return {spec, n, width: 1, data: new Float32Array(n).fill(1)};
  }
  const w = columnOf(what, {...spec, dtype: 'float32'}, sampleWeight, 1);
  if (w.n !== n) throw new TrainingPackageError(`${what} has ${w.n} rows, X has ${n}`);
  const negative = w.data.findIndex((v) => v < 0);
  if (negative >= 0) {
    throw new TrainingPackageError(`${what} has negative values (row ${negative}: ${w.data[negative]}): a weight ` +
      "scales its row's loss and must be >= 0, as Python's trainers require");
  }
  if (w.data.every((v) => v === 0)) {
    throw new TrainingPackageError(`${what} is zero everywhere: the loss and every gradient would be 0`);
  }
  return {spec, ...w};
}

/** Rows [start, end) of prepared columns (views, no copy). */
export function sliceColumn(c, start, end) {
  const [from, to] = [start * c.width, end * c.width];
  return {...c, n: end - start, data: ArrayBuffer.isView(c.data) ? c.data.subarray(from, to) : c.data.slice(from, to)};
}

/** The first output tensor as plain values: one per row, or one array per row. */
export function plainRows(tensor) {
  const data = Array.from(tensor.data, (v) => (typeof v === 'bigint' ? Number(v) : v));
  const n = tensor.dims.length ? tensor.dims[0] : 1;
  const width = n ? data.length / n : 0;
  if (width === 1) return data;
  return Array.from({length: n}, (_, i) => data.slice(i * width, (i + 1) * width));
}
