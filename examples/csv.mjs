// How the examples (examples/node/train.mjs, examples/browser/index.html and worker.js) read a CSV file: one row per
// sample, the target in the last column, the first line naming the columns when `header` is set. Cells may be quoted
// ("a, b", "say ""hi""", line breaks inside quotes), as pandas' to_csv writes them.
//
// A package exported from a table (its manifest declares `preprocess.columns`) gets the cells as they are: rows as
// objects keyed by column name (with a header) or arrays of cells in the package's column order (without), and the
// target's cells; the library converts each cell by its column's kind and names a bad one's row and column. Any
// other package takes numbers: an empty cell, a feature that is not a finite number or a row of another width is an
// Error naming the file's line and the column (both from 1), never a 0 in its place.

/** The rows of a CSV text as arrays of cells (strings, unquoted) and the line (from 1) each row starts on. */
export function csvRows(text, where = 'the CSV') {
  const rows = [];
  const lines = [];
  let row = [];
  let cell = '';
  let quoted = false;
  let line = 1;
  let start = 1;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') {
        cell += '"';
        i++;
      } else if (c === '"') {
        quoted = false;
      } else {
        if (c === '\n') line++;
        cell += c;
      }
    } else if (c === '"' && cell === '') {
      quoted = true;
    } else if (c === ',') {
      row.push(cell);
      cell = '';
    } else if (c === '\n' || c === '\r') {
      if (c === '\r' && text[i + 1] === '\n') i++;
      row.push(cell);
      rows.push(row);
      lines.push(start);
      row = [];
      cell = '';
      start = ++line;
    } else {
      cell += c;
    }
  }
  if (quoted) throw new Error(`${where}, line ${start}: a quoted cell is not closed`);
  if (cell !== '' || row.length) {
    row.push(cell);
    rows.push(row);
    lines.push(start);
  }
  while (rows.length && rows[rows.length - 1].every((c) => c.trim() === '')) {  // blank lines at the end
    rows.pop();
    lines.pop();
  }
  return {rows, lines};
}

/**
 * The samples of a CSV text for the package of `manifest`: {X, y, lines}, `lines[r]` the file's line of row r (from
 * 0, as the library's errors count rows: `describeCsvError` adds the line to such an error).
 */
export function csvData(text, manifest, {header = false, where = 'the CSV'} = {}) {
  const {rows, lines} = csvRows(text, where);
  const names = header ? rows.shift() : null;
  if (header) lines.shift();
  if (!rows.length) throw new Error(`${where}: no rows`);
  const width = names ? names.length : rows[0].length;
  rows.forEach((cells, r) => {
    if (cells.length !== width || width < 2) {
      throw new Error(`${where}, line ${lines[r]}: ${cells.length} cells, the ` +
        `${names ? 'header has' : 'first row has'} ${width} (the features, then the target)`);
    }
  });
  const y = rows.map((cells) => cells[width - 1]);
  if (manifest.preprocess && manifest.preprocess.columns) {  // a table: the library converts the raw cells
    const X = names ? rows.map((cells) => Object.fromEntries(names.map((name, j) => [name, cells[j]]))) :
      rows.map((cells) => cells.slice(0, -1));
    return {X, y, lines};
  }
  const X = rows.map((cells, r) => cells.slice(0, -1).map((raw, j) => {
    const cell = raw.trim();
    const place = `${where}, line ${lines[r]}, column ${j + 1}${names ? ` (${names[j]})` : ''}`;
    if (cell === '') throw new Error(`${place}: empty cell`);
    if (!Number.isFinite(Number(cell))) throw new Error(`${place}: ${JSON.stringify(cell)} is not a finite number`);
    return Number(cell);
  }));
  return {X, y: y.map((raw, r) => {
    const cell = raw.trim();
    if (cell === '') {
      throw new Error(`${where}, line ${lines[r]}, column ${width}${names ? ` (${names[width - 1]})` : ''}: ` +
        'empty cell (the target)');
    }
    return Number.isNaN(Number(cell)) ? cell : Number(cell);  // a number, or a class label
  }), lines};
}

/** The library's error about row r of the CSV data with the file's line added to its message. */
export function describeCsvError(err, data, where = 'the CSV') {
  if (data && data.lines && Number.isInteger(err.row) && data.lines[err.row] !== undefined) {
    err.message += ` (${where}, line ${data.lines[err.row]})`;
  }
  return err;
}
