// The training-package format in JavaScript: the manifest checked against the JSON Schema that Python generates from
// its one definition (ortflow/package/format.py -> ./schema.js), the checks of the fields against each other that a
// schema cannot say, and the state-file codec. Browser-safe: no `node:` module.
import {SCHEMA, FORMAT, FORMAT_VERSION, STATE_FORMAT, STATE_MAGIC, GENERATOR, MAX_HEADER} from './schema.js';

export {FORMAT, FORMAT_VERSION, STATE_FORMAT, GENERATOR};

/** A package, a state or data that cannot be used; the message names the file or the field. */
export class TrainingPackageError extends Error {
  constructor(message) {
    super(message);
    this.name = 'TrainingPackageError';
  }
}

const MAGIC = Array.from(STATE_MAGIC, (c) => c.charCodeAt(0));

function fail(where, path, message) {
  throw new TrainingPackageError(`${where ? `${where}: ` : ''}${path || 'the manifest'}: ${message}`);
}

function show(value) {
  let text;
  try {
    text = typeof value === 'number' && !Number.isFinite(value) ? String(value) : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = String(value);
  return text.length <= 60 ? text : `${text.slice(0, 57)}...`;
}

const key = (path, name) => (path ? `${path}.${name}` : name);

/**
 * The first key an object of the JSON `text` gives twice, as {key, path} (path: the object's place, '' for the
 * top), or null. JSON.parse keeps the last value silently; Python's reader (ortflow/package/state.py's strict_json)
 * refuses the file, so this one does too. `text` must be JSON (it scans what JSON.parse accepted): a string token
 * ends at its first unescaped quote, and each key is decoded, so "a" and "\u0061" are the same key.
 */
function keyGivenTwice(text) {
  const open = [];  // per enclosing object or list: {keys: Set (an object) or null (a list), key or index, path}
  const inside = (top) => (top === undefined ? '' : top.keys ? key(top.path, top.key) : `${top.path}[${top.index}]`);
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    const top = open[open.length - 1];
    if (c === '"') {
      let end = i + 1;
      while (text[end] !== '"') end += text[end] === '\\' ? 2 : 1;
      if (top?.keys && top.key === undefined) {  // a key: the next token after `{` or an object's `,`
        const name = JSON.parse(text.slice(i, end + 1));
        if (top.keys.has(name)) return {key: name, path: top.path};
        top.keys.add(name);
        top.key = name;
      }
      i = end;
    } else if (c === '{' || c === '[') {
      open.push({keys: c === '{' ? new Set() : null, key: undefined, index: 0, path: inside(top)});
    } else if (c === '}' || c === ']') {
      open.pop();
    } else if (c === ',') {
      if (top.keys) top.key = undefined;
      else top.index += 1;
    }
  }
  return null;
}

/**
 * The JSON value of `bytes` (UTF-8: a Uint8Array, or a string), refused as Python's reader refuses it: not JSON,
 * not UTF-8, or an object giving a key twice (`${what}: the key 'rows' is given twice (in progress)`). `what` names
 * the file in the message.
 */
export function parseJson(bytes, what) {
  let text;
  let value;
  try {
    text = typeof bytes === 'string' ? bytes : new TextDecoder('utf-8', {fatal: true}).decode(bytes);
    value = JSON.parse(text);
  } catch (err) {
    throw new TrainingPackageError(`${what} is not readable JSON: ${err.message}`);
  }
  const twice = keyGivenTwice(text);
  if (twice) {
    throw new TrainingPackageError(`${what}: the key '${twice.key}' is given twice` +
      (twice.path ? ` (in ${twice.path})` : ''));
  }
  return value;
}

function resolve(schema) {
  while (schema && schema.$ref) schema = SCHEMA.$defs[schema.$ref.slice('#/$defs/'.length)];
  return schema;
}

function typeWords(schema) {
  const options = (resolve(schema).anyOf || [schema]).map(resolve);
  return options.map((s) => ('const' in s ? JSON.stringify(s.const) : {
    integer: 'a count', number: 'a number', string: 'a string', null: 'null', boolean: 'true or false',
    array: 'a list', object: 'an object'}[s.type] || 'a value')).join(' or ');
}

function checkJson(value, path, where) {
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) fail(where, path, `${show(value)} is not a finite number`);
  } else if (Array.isArray(value)) {
    value.forEach((v, i) => checkJson(v, `${path}[${i}]`, where));
  } else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) checkJson(v, `${path}['${k}']`, where);
  } else if (value !== null && !['string', 'boolean'].includes(typeof value)) {
    fail(where, path, `${show(value)} is not a JSON value`);
  }
}

/** `value` checked against `schema` (the subset of JSON Schema that format.py writes). */
function check(schema, value, path, where) {
  schema = resolve(schema);
  if (schema.anyOf) {
    for (const option of schema.anyOf) {
      try {
        check(option, value, path, where);
        return;
      } catch (err) {
        if (!(err instanceof TrainingPackageError)) throw err;
      }
    }
    fail(where, path, `${show(value)} is not ${typeWords(schema)}`);
  }
  if ('const' in schema) {
    if (value !== schema.const) fail(where, path, `${show(value)} is not one of ${show([schema.const])}`);
    return;
  }
  if (schema.enum) {
    if (!schema.enum.includes(value)) fail(where, path, `${show(value)} is not one of ${show(schema.enum)}`);
    return;
  }
  switch (schema.type) {
    case undefined:
      checkJson(value, path, where);
      return;
    case 'null':
      if (value !== null) fail(where, path, `${show(value)} is not null`);
      return;
    case 'string':
      if (typeof value !== 'string') fail(where, path, `${show(value)} is not a string`);
      return;
    case 'boolean':
      if (typeof value !== 'boolean') fail(where, path, `${show(value)} is not true or false`);
      return;
    case 'number':
      if (typeof value !== 'number' || !Number.isFinite(value)) {
        fail(where, path, `${show(value)} is not a finite number`);
      }
      return;
    case 'integer':
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
        fail(where, path, `${show(value)} is not a count (an integer >= 0)`);
      }
      if (value > schema.maximum) fail(where, path, `${value} is not a count from 0 to below 2**53`);
      return;
    case 'array':
      if (!Array.isArray(value)) fail(where, path, `${show(value)} is not a list`);
      value.forEach((v, i) => check(schema.items, v, `${path}[${i}]`, where));
      return;
    case 'object': {
      if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        fail(where, path, `${show(value)} is not an object`);
      }
      const props = schema.properties;
      if (!props) {
        for (const [k, v] of Object.entries(value)) check(schema.additionalProperties, v, `${path}['${k}']`, where);
        return;
      }
      for (const name of schema.required) {
        if (!Object.prototype.hasOwnProperty.call(value, name)) fail(where, key(path, name), 'is missing');
      }
      for (const [name, v] of Object.entries(value)) {
        if (Object.prototype.hasOwnProperty.call(props, name)) check(props[name], v, key(path, name), where);
        else if (schema.additionalProperties === false) {
          fail(where, key(path, name), `is not a field (known: ${show(Object.keys(props))})`);
        } else checkJson(v, key(path, name), where);
      }
      return;
    }
    default:
      throw new Error(`schema type ${schema.type} has no rule`);
  }
}

/** The number of values of `shape` (Infinity when it passes JavaScript's safe integers). */
function size(shape) {
  if (shape.includes(0)) return 0;
  return shape.reduce((a, b) => a * b, 1);
}

const sameShape = (a, b) => Array.isArray(a) && Array.isArray(b) && a.length === b.length &&
  a.every((d, i) => d === b[i]);

function findEntry(specs, name, path, field, where) {
  const i = specs.findIndex((s) => s.name === name);
  if (i < 0) fail(where, path, `no entry named ${show(name)} (its ${field})`);
  return [i, specs[i]];
}

/** Give every graph input and output its role where the manifest left it out (as format.py's fill_roles). */
function fillRoles(m) {
  const roles = new Map(m.step.inputs.filter((s) => s.role).map((s) => [s.name, s.role]));
  for (const s of m.step.outputs) s.role ??= s.name === m.step.loss_output ? 'loss' : 'state';
  for (const entry of [m.step_flat, ...(m.unrolled || [])]) {
    for (const s of entry.inputs) s.role ??= s.name === entry.state_input ? 'state' : (roles.get(s.name) ?? 'data');
    for (const s of entry.outputs) {
      s.role ??= s.name === entry.state_output ? 'state' : s.name === entry.losses_output ? 'losses' : 'loss';
    }
  }
  for (const s of m.predict.inputs) s.role ??= 'data';
  for (const s of m.predict.outputs) s.role ??= 'prediction';
}

function crossCheck(m, where) {
  const f = (bad, path, message) => { if (bad) fail(where, path, message); };
  f(m.batch_size < 1, 'batch_size', `${m.batch_size} must be at least 1`);
  const byName = new Map();
  let offset = 0;
  m.state.tensors.forEach((t, i) => {
    const at = `state.tensors[${i}]`;
    f(byName.has(t.name), `${at}.name`, `${show(t.name)} is listed twice`);
    byName.set(t.name, t);
    f(t.length !== size(t.shape), `${at}.length`,
      `${t.length} values, but the shape ${show(t.shape)} holds ${size(t.shape)}`);
    f(t.offset !== offset, `${at}.offset`,
      `${t.offset}: the tensors lie one after the other, this one at byte ${offset}`);
    offset += 4 * t.length;
  });
  f(m.state.bytes !== offset, 'state.bytes', `${m.state.bytes}, but the state tensors hold ${offset} bytes`);
  const weights = new Set();
  m.state.weights.forEach((w, i) => {
    f(!byName.has(w), `state.weights[${i}]`, `${show(w)} is not a state tensor`);
    f(weights.has(w), `state.weights[${i}]`, `${show(w)} is listed twice`);
    weights.add(w);
  });
  const files = m.files || {};
  for (const [name, at] of [[m.step.file, 'step.file'], [m.step_flat.file, 'step_flat.file'],
    [m.predict.file, 'predict.file'], [m.loss_model.file, 'loss_model.file'], [m.state.file, 'state.file'],
    ...(m.unrolled || []).map((u, i) => [u.file, `unrolled[${i}].file`])]) {
    f(!Object.prototype.hasOwnProperty.call(files, name), at, `${show(name)} is not listed in files`);
  }
  f(files[m.state.file].bytes !== m.state.bytes, `files['${m.state.file}'].bytes`,
    `${files[m.state.file].bytes}, but state.bytes is ${m.state.bytes}`);
  // the step graph takes and gives the state tensors
  const state = m.step.inputs.map((s, i) => [i, s]).filter(([, s]) => s.role === 'weight' || s.role === 'slot');
  f(!sameShape(state.map(([, s]) => s.name), [...byName.keys()]), 'step.inputs',
    `the weight and slot inputs ${show(state.map(([, s]) => s.name))} are not the state tensors ` +
    `${show([...byName.keys()])}`);
  for (const [i, s] of state) {
    f(!sameShape(s.shape, byName.get(s.name).shape), `step.inputs[${i}].shape`,
      `${show(s.shape)}, but the state tensor ${show(s.name)} has shape ${show(byName.get(s.name).shape)}`);
  }
  const outputs = m.step.outputs;
  f(!outputs.length || outputs[0].name !== m.step.loss_output, 'step.outputs[0].name',
    `the step's first output is its loss ${show(m.step.loss_output)}`);
  f(outputs.length !== 1 + byName.size, 'step.outputs',
    `${outputs.length} outputs: the loss and ${byName.size} updated state tensors come out`);
  [...byName.values()].forEach((t, k) => {
    f(!sameShape(outputs[k + 1].shape, t.shape), `step.outputs[${k + 1}].shape`,
      `${show(outputs[k + 1].shape)}, but the state tensor ${show(t.name)} has shape ${show(t.shape)}`);
  });
  const total = offset / 4;
  const flat = (at, entry) => {
    let [i, spec] = findEntry(entry.inputs, entry.state_input, `${at}.inputs`, 'state_input', where);
    f(!sameShape(spec.shape, [total]), `${at}.inputs[${i}].shape`,
      `${show(spec.shape)}, but the state holds ${total} values`);
    [i, spec] = findEntry(entry.outputs, entry.state_output, `${at}.outputs`, 'state_output', where);
    f(!sameShape(spec.shape, [total]), `${at}.outputs[${i}].shape`,
      `${show(spec.shape)}, but the state holds ${total} values`);
  };
  flat('step_flat', m.step_flat);
  (m.unrolled || []).forEach((u, i) => {
    const at = `unrolled[${i}]`;
    f(u.steps < 2, `${at}.steps`, `${u.steps} must be at least 2`);
    f(u.rows !== u.steps * m.batch_size, `${at}.rows`,
      `${u.rows}, but ${u.steps} steps of batch_size ${m.batch_size} take ${u.steps * m.batch_size}`);
    flat(at, u);
    const [k, losses] = findEntry(u.outputs, u.losses_output, `${at}.outputs`, 'losses_output', where);
    f(!sameShape(losses.shape, [u.steps]), `${at}.outputs[${k}].shape`,
      `${show(losses.shape)}, but ${u.steps} losses come out`);
  });
  // the prediction graph's weight patches lie inside predict.onnx and hold their weight's bytes
  const predictBytes = files[m.predict.file].bytes;
  const ranges = [];
  m.predict.weights.forEach((p, i) => {
    const at = `predict.weights[${i}]`;
    f(!weights.has(p.name), `${at}.name`, `${show(p.name)} is not a trained weight`);
    const t = byName.get(p.name);
    f(!sameShape(p.shape, t.shape), `${at}.shape`, `${show(p.shape)}, but the state tensor has shape ${show(t.shape)}`);
    f(p.bytes !== 4 * t.length, `${at}.bytes`,
      `${p.bytes}, but the weight ${show(p.name)} holds ${4 * t.length} bytes`);
    f(p.offset + p.bytes > predictBytes, `${at}.offset`,
      `bytes ${p.offset} to ${p.offset + p.bytes} lie outside ${show(m.predict.file)} (${predictBytes} bytes)`);
    ranges.push([p.offset, p.offset + p.bytes, i]);
  });
  ranges.sort((a, b) => a[0] - b[0]);
  for (let k = 1; k < ranges.length; k++) {
    f(ranges[k][0] < ranges[k - 1][1], `predict.weights[${ranges[k][2]}].offset`, "overlaps another weight's bytes");
  }
  const names = new Set(m.step.inputs.map((s) => s.name));
  m.data_inputs.forEach((d, i) => f(!names.has(d.name), `data_inputs[${i}].name`,
    `${show(d.name)} is not an input of the step graph`));
  f(!names.has(m.target.name), 'target.name', `${show(m.target.name)} is not an input of the step graph`);
  f(m.sample_weight !== null && !names.has(m.sample_weight), 'sample_weight',
    `${show(m.sample_weight)} is not an input of the step graph`);
  f(m.target.encoding !== 'value' && !(m.target.classes && m.target.classes.length), 'target.classes',
    `a ${m.target.encoding} target needs its classes`);
  for (const name of Object.keys(files)) {
    f(name === '' || name === '.' || name.startsWith('/') || name.includes('\\') || name.split('/').includes('..'),
      `files['${name}']`, 'names a file outside the package');
  }
}

/**
 * `manifest` checked against the format (types, nulls, non-finite numbers, counts, the fields against each other);
 * its graph entries get their roles where an older writer left them out. Returns the manifest; throws a
 * TrainingPackageError naming `where` and the field (e.g. `state.tensors[2].shape[0]`).
 */
export function validateManifest(manifest, where = 'the manifest') {
  if (manifest === null || typeof manifest !== 'object' || Array.isArray(manifest)) {
    fail(where, '', `${show(manifest)} is not an object`);
  }
  if (manifest.format !== FORMAT) {
    fail(where, 'format', `the manifest has format ${show(manifest.format)}, not ${show(FORMAT)}`);
  }
  if (manifest.format_version !== FORMAT_VERSION) {
    fail(where, 'format_version', `the manifest has format_version ${show(manifest.format_version)}; this library ` +
      `reads version ${FORMAT_VERSION}`);
  }
  check(SCHEMA, manifest, '', where);
  fillRoles(manifest);
  crossCheck(manifest, where);
  return manifest;
}

/** The inputs of a graph entry of the manifest (`step`, `step_flat`, an `unrolled[i]`, `predict`) with `role`. */
export function inputsByRole(entry, role) {
  return entry.inputs.filter((s) => s.role === role);
}

function checkProgress(progress, where) {
  const out = {};
  for (const name of ['epochs', 'steps', 'rowsSeen', 'rows']) {
    const v = progress?.[name] ?? 0;
    if (!Number.isSafeInteger(v) || v < 0) fail(where, name, `${show(v)} is not a count (a safe integer >= 0)`);
    out[name] = v;
  }
  return out;
}

/**
 * The state file (see ortflow/package/state.py) of `state` (a Float32Array in state.bin's layout) and `progress`
 * ({epochs, steps, rowsSeen, rows}): the bytes Python's `load_training_state` reads, in a Uint8Array of its own.
 */
export function encodeState(manifest, state, progress = {}) {
  const tensors = manifest.state.tensors;
  const total = tensors.reduce((n, t) => n + t.length, 0);
  if (!(state instanceof Float32Array) || state.length !== total) {
    throw new TrainingPackageError(`the state must be a Float32Array of ${total} values (state.bin's layout), got ` +
      `${state && state.length} values`);
  }
  const p = checkProgress(progress, 'the state');
  let offset = 0;
  const table = tensors.map((t) => {
    const entry = {name: t.name, shape: t.shape, offset, length: t.length};
    offset += 4 * t.length;
    return entry;
  });
  let text = JSON.stringify({format: STATE_FORMAT, format_version: FORMAT_VERSION, package_id: manifest.package_id,
    tensors: table, epochs: p.epochs, steps: p.steps, rows_seen: p.rowsSeen, rows: p.rows});
  let header = new TextEncoder().encode(text);
  if (header.length % 4) {
    text += ' '.repeat(4 - (header.length % 4));
    header = new TextEncoder().encode(text);
  }
  const out = new Uint8Array(new ArrayBuffer(8 + header.length + 4 * total));
  out.set(MAGIC, 0);
  new DataView(out.buffer).setUint32(4, header.length, true);
  out.set(header, 8);
  const view = new DataView(out.buffer, 8 + header.length);
  for (let i = 0; i < total; i++) view.setFloat32(4 * i, state[i], true);
  return out;
}

/**
 * The state file `bytes` of the package of `manifest`, checked: magic, format, version, package id, the tensors'
 * names and shapes (each once), counts (non-negative safe integers), the size (no missing or trailing byte),
 * finite values. Returns {state: Float32Array in state.bin's layout, progress: {epochs, steps, rowsSeen, rows}}.
 */
export function decodeState(bytes, manifest, where = 'the state') {
  if (bytes instanceof ArrayBuffer) bytes = new Uint8Array(bytes);
  if (!(bytes instanceof Uint8Array)) {
    throw new TrainingPackageError(`${where} must be a Uint8Array or an ArrayBuffer, got ${typeof bytes}`);
  }
  if (bytes.length < 8 || MAGIC.some((b, i) => bytes[i] !== b)) {
    throw new TrainingPackageError(`${where} is not an ortflow training state (it does not start with ${STATE_MAGIC})`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const length = view.getUint32(4, true);
  if (length > Math.min(MAX_HEADER, bytes.length - 8)) {
    throw new TrainingPackageError(`${where}: its header length ${length} runs past the file (${bytes.length} ` +
      `bytes) or the limit of ${MAX_HEADER} bytes`);
  }
  const at = `${where}'s header`;
  const header = parseJson(bytes.subarray(8, 8 + length), at);
  if (header === null || typeof header !== 'object' || header.format !== STATE_FORMAT ||
      header.format_version !== FORMAT_VERSION) {
    fail(at, 'format_version', `the state has format ${show(header?.format)} version ` +
      `${show(header?.format_version)}; this library reads ${show(STATE_FORMAT)} version ${FORMAT_VERSION}`);
  }
  check(SCHEMA.$defs.StateHeader, header, '', at);
  if (header.package_id !== manifest.package_id) {
    throw new TrainingPackageError(`${where} was trained from another package (package_id ` +
      `${show(header.package_id)}, this package's is ${show(manifest.package_id)})`);
  }
  const expected = new Map(manifest.state.tensors.map((t) => [t.name, t]));
  const seen = new Set();
  let dataBytes = 0;
  header.tensors.forEach((t, i) => {
    if (seen.has(t.name)) fail(at, `tensors[${i}].name`, `${show(t.name)} is listed twice`);
    seen.add(t.name);
    if (t.length !== size(t.shape)) {
      fail(at, `tensors[${i}].length`, `${t.length} values, but the shape ${show(t.shape)} holds ${size(t.shape)}`);
    }
    dataBytes += 4 * t.length;
  });
  const missing = [...expected.keys()].filter((n) => !seen.has(n));
  const unknown = [...seen].filter((n) => !expected.has(n));
  const shapes = header.tensors.filter((t) => expected.has(t.name) && !sameShape(t.shape, expected.get(t.name).shape))
    .map((t) => `${t.name}: ${show(t.shape)} instead of ${show(expected.get(t.name).shape)}`);
  if (missing.length || unknown.length || shapes.length) {
    throw new TrainingPackageError(`${where} does not hold the package's state: missing ${show(missing)}, unknown ` +
      `${show(unknown)}, other shapes ${show(shapes)}`);
  }
  const held = bytes.length - 8 - length;
  if (held !== dataBytes) {
    throw new TrainingPackageError(`${where}: its table announces ${dataBytes} bytes of values, the file holds ` +
      `${held} (${held > dataBytes ? 'trailing bytes' : 'truncated'})`);
  }
  const total = manifest.state.tensors.reduce((n, t) => n + t.length, 0);
  const state = new Float32Array(total);
  const data = new DataView(bytes.buffer, bytes.byteOffset + 8 + length, held);
  let end = 0;
  for (const t of [...header.tensors].sort((a, b) => a.offset - b.offset)) {
    if (t.offset % 4 || t.offset < end || t.offset + 4 * t.length > held) {
      throw new TrainingPackageError(`${where}: tensor ${show(t.name)} lies outside the data or over another ` +
        `tensor (bytes ${t.offset} to ${t.offset + 4 * t.length} of ${held})`);
    }
    end = t.offset + 4 * t.length;
    const into = expected.get(t.name).offset / 4;
    let bad = 0;
    for (let i = 0; i < t.length; i++) {
      const v = data.getFloat32(t.offset + 4 * i, true);
      if (!Number.isFinite(v)) bad++;
      state[into + i] = v;
    }
    if (bad) throw new TrainingPackageError(`${where}: tensor ${show(t.name)} holds ${bad} non-finite value(s)`);
  }
  return {state, progress: {epochs: header.epochs, steps: header.steps, rowsSeen: header.rows_seen,
    rows: header.rows}};
}

/**
 * The graph entry `entry` of the manifest (`step`, `step_flat`, an `unrolled[i]`, `predict`; `path` names it in
 * errors) against the onnxruntime session made from its file: the same input and output names in the same order and,
 * where the runtime gives them (`inputMetadata`, `outputMetadata`), the same dtypes and fixed sizes. Throws a
 * TrainingPackageError naming the field (`step.inputs[0].shape`), as Python's check_graph does.
 */
export function checkGraph(entry, session, path, where = 'the manifest') {
  for (const [key, names, metadata] of [['inputs', session.inputNames, session.inputMetadata],
    ['outputs', session.outputNames, session.outputMetadata]]) {
    const specs = entry[key];
    if (!sameShape(specs.map((s) => s.name), [...names])) {
      fail(where, `${path}.${key}`,
        `the manifest lists ${show(specs.map((s) => s.name))}, the graph has ${show([...names])}`);
    }
    (metadata || []).forEach((meta, i) => {
      const spec = specs[i];
      if (!meta || !meta.isTensor) return;
      if (meta.type !== undefined && meta.type !== spec.dtype) {
        fail(where, `${path}.${key}[${i}].dtype`, `${show(spec.dtype)}, the graph has ${show(meta.type)}`);
      }
      const shape = meta.shape || [];
      if (!spec.shape || !shape.length) return;
      const fixed = (d) => typeof d === 'number' && d >= 0;
      if (shape.length !== spec.shape.length ||
          spec.shape.some((d, k) => fixed(d) && fixed(shape[k]) && d !== shape[k])) {
        fail(where, `${path}.${key}[${i}].shape`, `${show(spec.shape)}, the graph has ${show(shape)}`);
      }
    });
  }
}
