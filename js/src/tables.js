// A table's raw cells as the package's inputs take them: a package exported from a table declares its raw columns
// (the manifest's `preprocess.columns`, name -> kind, and `preprocess.text_missing`), one data input each, and the
// conversion no graph does: each cell converted by its column's kind, as the pipelines read the table's CSV
// (pandas' read_csv, pipelines/data/tables.py) and as the served model converts a request
// (pipelines/tracking/serving_model.py's table_feeds). A cell not of its column's kind is a TrainingPackageError
// naming the row (from 0), the column and the cell; the error's `row` and `column` say them too.
//
// X: rows as objects keyed by column name (what a CSV parser gives with a header; other keys, the target's, are
// ignored), arrays of cells in the order of `preprocess.columns`, or {column: cells}. A cell: a string (CSV text), a
// number, a boolean, a Date, or a gap (null, undefined, NaN, '' and the other texts read_csv reads as missing).

import {TrainingPackageError} from './format.js';
import {ARRAYS, columnOf, dataColumns, isTensor, targetsOf} from './data.js';

/** the texts pandas' read_csv reads as a missing cell (its default na_values), '' among them */
const GAP_TEXTS = new Set(['', '#N/A', '#N/A N/A', '#NA', '-1.#IND', '-1.#QNAN', '-NaN', '-nan', '1.#IND',
  '1.#QNAN', '<NA>', 'N/A', 'NA', 'NULL', 'NaN', 'None', 'n/a', 'nan', 'null']);
/** a date gap's day count: the smallest int64 (pandas' NaT), as ortflow.convert.tables' MISSING_DAY */
const MISSING_DAY = -(2n ** 63n);
const FLOAT32_MAX = 3.4028234663852886e38;
const DAY_MS = 86400000;
/** the instants pandas holds (nanoseconds in an int64, NaT excluded), in whole milliseconds */
const FIRST_MS = -9223372036854;
const LAST_MS = 9223372036854;
/** a number as pandas' parsers read one: a sign, digits with a decimal point, an exponent; spaces around */
const NUMBER = /^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/;
/** ISO 8601 date text, the time of day and a UTC offset optional (what the pipelines read as a date column) */
const ISO_DATE = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:?\d{2})?)?$/;

/** A cell of the wrong kind: the reason; the caller names the row, the column and the cell. */
class CellError extends Error {}

function isGap(cell) {
  return cell === null || cell === undefined || (typeof cell === 'number' && Number.isNaN(cell)) ||
    (typeof cell === 'string' && GAP_TEXTS.has(cell));
}

function finiteFloat32(value) {
  if (!Number.isFinite(value)) throw new CellError('not a finite number');
  if (Math.abs(value) > FLOAT32_MAX) {
    throw new CellError("beyond float32's range (±3.4e38), which the model computes in");
  }
  return value;
}

/** A number cell: a number, or its text as read_csv and pandas.to_numeric read it (no separators, no hex). */
function numberCell(cell) {
  if (typeof cell === 'number') return finiteFloat32(cell);
  if (typeof cell === 'bigint') return finiteFloat32(Number(cell));
  if (typeof cell === 'string' && NUMBER.test(cell)) return finiteFloat32(Number(cell));
  throw new CellError(typeof cell === 'boolean' ? 'a boolean, not a number' : 'not a finite number');
}

/** A boolean cell as 1 or 0: true/false, their text in any case (read_csv's), and the numbers 1 and 0. */
function boolCell(cell) {
  if (typeof cell === 'boolean') return cell ? 1 : 0;
  if (cell === 1 || cell === 0) return cell;
  const text = typeof cell === 'string' ? cell.toLowerCase() : null;
  if (text === 'true' || text === 'false') return text === 'true' ? 1 : 0;
  throw new CellError('not a boolean (true or false, in any letter case, or 1 or 0)');
}

/** A text cell as it is; a number or a boolean as Python's str writes it (an integral number without ".0"). */
function textCell(cell) {
  if (typeof cell === 'string') return cell;
  if (typeof cell === 'boolean') return cell ? 'True' : 'False';
  if (typeof cell === 'bigint') return cell.toString();
  if (typeof cell !== 'number') throw new CellError('not text (a string, a number or a boolean)');
  if (!Number.isFinite(cell)) return cell > 0 ? 'inf' : '-inf';
  if (Number.isInteger(cell)) return BigInt(cell).toString();
  if (Math.abs(cell) >= 1e-4) return String(cell);
  return cell.toExponential().replace(/e([+-])(\d)$/, 'e$10$2');  // 1.5e-07, as Python's repr
}

/** The milliseconds since 1970-01-01 UTC of ISO date text (NaN when it is no such date). */
function isoMs(text) {
  const m = ISO_DATE.exec(text.trim());
  if (!m) return NaN;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map((v) => Number(v || 0));
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  if (date.getUTCMonth() !== month - 1 || date.getUTCDate() !== day || hour > 23 || minute > 59 || second > 59) {
    return NaN;  // 2021-02-30, 25:00
  }
  date.setUTCHours(hour, minute, second, m[7] ? Math.floor(Number(`0.${m[7]}`) * 1000) : 0);
  let offset = 0;  // an offset's time is converted to UTC, as pandas' tz_convert(None)
  if (m[8] && m[8] !== 'Z') {
    const sign = m[8][0] === '-' ? -1 : 1;
    const digits = m[8].slice(1).replace(':', '');
    offset = sign * (Number(digits.slice(0, 2)) * 60 + Number(digits.slice(2))) * 60000;
  }
  return date.getTime() - offset;
}

/** A date cell as its day count since 1970-01-01 (an int64): ISO text, or a Date (its UTC day). */
function dateCell(cell) {
  let ms;
  if (cell instanceof Date) {
    ms = cell.getTime();
    if (Number.isNaN(ms)) throw new CellError('an invalid Date');
  } else if (typeof cell === 'string') {
    ms = isoMs(cell);
    if (Number.isNaN(ms)) throw new CellError('not a date: write dates as ISO text, YYYY-MM-DD');
  } else {
    throw new CellError('not a date (ISO text, YYYY-MM-DD, or a Date)');
  }
  if (ms < FIRST_MS || ms > LAST_MS) {
    throw new CellError('beyond the dates pandas holds (1677-09-21 00:12:43 to 2262-04-11 23:47:16 UTC)');
  }
  return BigInt(Math.floor(ms / DAY_MS));
}

/** each kind: the conversion of one cell, the value of a gap, and the input dtypes that take its values */
const KINDS = {
  number: {name: 'number', convert: numberCell, gap: NaN, dtypes: ['float32', 'float64']},
  bool: {name: 'bool', convert: boolCell, gap: NaN, dtypes: ['float32', 'float64']},
  text: {name: 'text', convert: textCell, gap: null, dtypes: ['string']},
  date: {name: 'date', convert: dateCell, gap: MISSING_DAY, dtypes: ['int64']},
};

function shown(cell) {
  if (cell instanceof Date) return Number.isNaN(cell.getTime()) ? 'Invalid Date' : `Date(${cell.toISOString()})`;
  if (typeof cell === 'bigint') return `${cell}n`;
  if (cell !== null && typeof cell === 'object') return Array.isArray(cell) ? 'an array' : 'an object';
  return JSON.stringify(cell);
}

/** A cell's error naming the row, the column (`kind`: its kind; null for the target) and the cell. */
function cellError(what, cells, row, column, kind, problem) {
  const where = column === null ? '' : `, column ${JSON.stringify(column)} (a ${kind.name} column)`;
  const error = new TrainingPackageError(`${what} holds ${shown(cells[row])} at row ${row}${where}: ${problem}`);
  error.row = row;
  error.column = column;
  return error;
}

/** The cells of the column `name` (null: the target) converted by `kind` into `out`, a gap as `gap`. */
function convertColumn(what, name, kind, cells, out, gap) {
  for (let r = 0; r < cells.length; r++) {
    const cell = cells[r];
    if (isGap(cell)) {
      out[r] = gap;
      continue;
    }
    try {
      out[r] = kind.convert(cell);
    } catch (err) {
      if (!(err instanceof CellError)) throw err;
      throw cellError(what, cells, r, name, kind, err.message);
    }
  }
  return out;
}

function isRecord(x) {
  return x !== null && typeof x === 'object' && !Array.isArray(x) && !ArrayBuffer.isView(x) && !(x instanceof Date) &&
    !isTensor(x);
}

/** The cells of each column of X (rows as objects or arrays, or {column: cells}): {name: cells or tensor}. */
function cellsByColumn(X, names, what) {
  const order = `the package's columns, in this order: ${JSON.stringify(names)}`;
  let byName;
  if (Array.isArray(X)) {
    if (!X.length) throw new TrainingPackageError(`${what} is empty: at least one row is needed`);
    if (X.every((row) => Array.isArray(row) || ArrayBuffer.isView(row))) {
      const bad = X.findIndex((row) => row.length !== names.length);
      if (bad >= 0) {
        throw new TrainingPackageError(`${what} row ${bad} has ${X[bad].length} cells; rows of cells take ${order}`);
      }
      return Object.fromEntries(names.map((name, j) => [name, X.map((row) => row[j])]));
    }
    const bad = X.findIndex((row) => !isRecord(row));
    if (bad >= 0) {
      throw new TypeError(`${what} row ${bad} is ${shown(X[bad])}: give every row as an object keyed by column ` +
        `name, or every row as an array of cells (${order})`);
    }
    byName = Object.fromEntries(names.filter((name) => X.some((row) => Object.hasOwn(row, name)))
      .map((name) => [name, X.map((row) => row[name])]));
  } else if (isRecord(X)) {
    byName = Object.fromEntries(names.filter((name) => Object.hasOwn(X, name)).map((name) => [name, X[name]]));
  } else {
    throw new TypeError(`${what} must be rows (objects keyed by column name, or arrays of cells: ${order}) or ` +
      `{column: cells}, got ${X === null ? 'null' : typeof X}`);
  }
  const missing = names.filter((name) => !Object.hasOwn(byName, name));
  if (missing.length) {
    throw new TrainingPackageError(`${what} lacks the columns ${JSON.stringify(missing)}; the package takes the ` +
      `columns ${JSON.stringify(names)} (rows as objects keyed by column name, or {column: cells})`);
  }
  return byName;
}

/**
 * X's table columns as the data inputs `specs` take them ([{spec, n, width: 1, data}], as data.js's dataColumns
 * gives them): each cell converted by its column's kind (`preprocess.columns`; text gaps become
 * `preprocess.text_missing`). A tensor (the whole X of a one-column table, or one column's) is fed as it is.
 */
export function tableColumns(specs, preprocess, X, what = 'X') {
  if (isTensor(X)) return dataColumns(specs, X, what);
  const kinds = preprocess.columns;
  const cells = cellsByColumn(X, Object.keys(kinds), what);
  const columns = specs.map((spec) => {
    const named = `${what} (${JSON.stringify(spec.name)})`;
    const declared = Object.hasOwn(kinds, spec.name) ? kinds[spec.name] : undefined;
    const kind = Object.hasOwn(KINDS, declared) ? KINDS[declared] : null;
    if (!kind) {
      throw new TrainingPackageError(`the package's input ${JSON.stringify(spec.name)} is ` +
        (declared === undefined ? 'not among its columns' : `a column of kind ${JSON.stringify(declared)}`) +
        ` (preprocess.columns); this library converts the kinds ${JSON.stringify(Object.keys(KINDS))}`);
    }
    if (!kind.dtypes.includes(spec.dtype) || spec.shape.length > 2 ||
        (spec.shape.length === 2 && spec.shape[1] !== 1)) {
      throw new TrainingPackageError(`the package's input ${JSON.stringify(spec.name)} (a ${declared} ` +
        `column) takes ${spec.dtype} of shape ${JSON.stringify(spec.shape)}; this library feeds such a column as ` +
        `${kind.dtypes.join(' or ')} of shape [rows, 1]`);
    }
    const given = cells[spec.name];
    if (isTensor(given)) return {spec, ...columnOf(named, spec, given, 1)};
    if (!Array.isArray(given) && !ArrayBuffer.isView(given)) {
      throw new TypeError(`${named} must be an array of cells, got ${given === null ? 'null' : typeof given}`);
    }
    if (!given.length) throw new TrainingPackageError(`${named} is empty: at least one row is needed`);
    const Kind = ARRAYS[spec.dtype] || Array;
    const gap = kind === KINDS.text ? String(preprocess.text_missing ?? '') : kind.gap;
    return {spec, n: given.length, width: 1, data: convertColumn(what, spec.name, kind, given,
      new Kind(given.length), gap)};
  });
  for (const c of columns) {
    if (c.n !== columns[0].n) {
      throw new TrainingPackageError(`${what} (${JSON.stringify(c.spec.name)}) has ${c.n} rows, ` +
        `${JSON.stringify(columns[0].spec.name)} has ${columns[0].n}`);
    }
  }
  return columns;
}

/**
 * The targets y of a table's package from raw cells (an array, one cell per row): a value target's cells as
 * numbers (text read as a number column's), class labels as text or numbers as the package's classes are; a gap
 * refused naming its row (the pipelines refuse a row without a target). Then data.js's targetsOf.
 */
export function tableTargets(y, target, what = 'y') {
  const width = target.shape.length > 1 ? target.shape[1] : 1;
  if (!Array.isArray(y) || (target.encoding === 'value' && width !== 1)) return targetsOf(y, target, what);
  const cells = y.map((cell) => (Array.isArray(cell) && cell.length === 1 ? cell[0] : cell));
  const gap = cells.findIndex(isGap);
  if (gap >= 0) throw cellError(what, cells, gap, null, null, 'a missing target');
  const kind = target.encoding !== 'value' && typeof target.classes[0] === 'string' ? KINDS.text : KINDS.number;
  return targetsOf(convertColumn(what, null, kind, cells, new Array(cells.length), null), target, what);
}

/** X as the columns of the data inputs `specs`: a table's raw cells (the manifest's `preprocess.columns`) or rows. */
export function featureColumns(specs, X, what, preprocess) {
  return preprocess && preprocess.columns ? tableColumns(specs, preprocess, X, what) : dataColumns(specs, X, what);
}

/** y as the package's target input takes it: from raw cells for a table's package. */
export function targetColumn(y, target, what, preprocess) {
  return preprocess && preprocess.columns ? tableTargets(y, target, what) : targetsOf(y, target, what);
}
