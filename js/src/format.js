// PROVISIONAL (owner: the `fmt` helper, whose format.js replaces this file): the training package's manifest check
// and the state file's byte layout, behind the names js/src/*.js use: FORMAT, FORMAT_VERSION, STATE_FORMAT, GENERATOR,
// TrainingPackageError, validateManifest, encodeState, decodeState, inputsByRole.

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

/** The manifest `m` of the package `where`, checked (format, version, generator, state layout); returns it. */
export function validateManifest(m, where) {
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
  // format version 1 writes roles on step.json's inputs only: the other graphs take the same inputs by name
  const roles = new Map(m.step.inputs.map((i) => [i.name, i.role]));
  for (const entry of [m.step_flat, ...(m.unrolled || [])]) {
    if (!entry) continue;
    for (const input of entry.inputs) {
      if (input.role === undefined) input.role = input.name === entry.state_input ? 'state' : roles.get(input.name);
    }
  }
  return m;
}

/** The inputs of a graph entry of the manifest (`step`, `step_flat`, an `unrolled[i]`) that have `role`. */
export function inputsByRole(entry, role) {
  return entry.inputs.filter((i) => i.role === role);
}

function stateLength(manifest) {
  return manifest.state.tensors.reduce((total, t) => total + t.length, 0);
}

/** The state file (`OFTS`, header length, JSON header, float32 data) of `state` (state.bin's layout) and progress. */
export function encodeState(manifest, state, progress) {
  let offset = 0;
  const table = manifest.state.tensors.map((t) => {
    const entry = {name: t.name, shape: t.shape, offset, length: t.length};
    offset += 4 * t.length;
    return entry;
  });
  const header = {format: STATE_FORMAT, format_version: FORMAT_VERSION, package_id: manifest.package_id,
    tensors: table, epochs: progress.epochs, steps: progress.steps, rows_seen: progress.rowsSeen,
    rows: progress.rows};
  const json = new TextEncoder().encode(JSON.stringify(header));
  const headerLength = Math.ceil(json.length / 4) * 4;
  const out = new Uint8Array(8 + headerLength + offset);
  out.set(STATE_MAGIC, 0);
  out.fill(0x20, 8, 8 + headerLength);
  out.set(json, 8);
  new DataView(out.buffer).setUint32(4, headerLength, true);
  const view = new DataView(out.buffer);
  for (let i = 0; i < state.length; i++) view.setFloat32(8 + headerLength + 4 * i, state[i], true);
  return out;
}

/** The state (state.bin's layout) and progress a state file holds, refused unless it is one of this package's. */
export function decodeState(bytes, manifest, where) {
  const fail = (why) => {
    throw new TrainingPackageError(`${where} is not a state of this package: ${why}`);
  };
  if (bytes.length < 8 || STATE_MAGIC.some((b, i) => bytes[i] !== b)) fail('it does not start with "OFTS"');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = view.getUint32(4, true);
  if (8 + headerLength > bytes.length) fail(`its header of ${headerLength} bytes is truncated`);
  let header;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
  } catch (err) {
    fail(`its header is not JSON (${err.message})`);
  }
  if (!header || header.format !== STATE_FORMAT || header.format_version !== FORMAT_VERSION) {
    fail(`format ${JSON.stringify(header && header.format)} version ` +
      `${JSON.stringify(header && header.format_version)}; this library reads ${JSON.stringify(STATE_FORMAT)} ` +
      `version ${FORMAT_VERSION}`);
  }
  if (header.package_id !== manifest.package_id) {
    fail(`it was trained from the package ${header.package_id}, this package is ${manifest.package_id}`);
  }
  const progress = {};
  for (const [key, field] of [['epochs', 'epochs'], ['steps', 'steps'], ['rowsSeen', 'rows_seen'], ['rows', 'rows']]) {
    const value = header[field];
    if (!Number.isSafeInteger(value) || value < 0) fail(`${field}=${JSON.stringify(value)} is not a count`);
    progress[key] = value;
  }
  const expected = new Map(manifest.state.tensors.map((t) => [t.name, t]));
  const data = 8 + headerLength;
  const state = new Float32Array(stateLength(manifest));
  const seen = new Set();
  let end = 0;
  for (const t of header.tensors || []) {
    const mine = expected.get(t.name);
    if (!mine) fail(`it holds the tensor ${JSON.stringify(t.name)}, which the package has not`);
    if (seen.has(t.name)) fail(`it holds the tensor ${JSON.stringify(t.name)} twice`);
    seen.add(t.name);
    if (JSON.stringify(t.shape) !== JSON.stringify(mine.shape) || t.length !== mine.length ||
        !Number.isSafeInteger(t.offset) || t.offset < 0 || t.offset % 4) {
      fail(`its tensor ${JSON.stringify(t.name)} has shape ${JSON.stringify(t.shape)} at offset ` +
        `${JSON.stringify(t.offset)}; the package's is ${JSON.stringify(mine.shape)}`);
    }
    if (data + t.offset + 4 * t.length > bytes.length) fail(`it is truncated in ${JSON.stringify(t.name)}`);
    for (let i = 0; i < t.length; i++) {
      const v = view.getFloat32(data + t.offset + 4 * i, true);
      if (!Number.isFinite(v)) fail(`its tensor ${JSON.stringify(t.name)} holds ${v} at ${i}`);
      state[mine.offset / 4 + i] = v;
    }
    end = Math.max(end, t.offset + 4 * t.length);
  }
  const missing = [...expected.keys()].filter((k) => !seen.has(k));
  if (missing.length) fail(`it lacks the tensors ${JSON.stringify(missing)}`);
  if (data + end !== bytes.length) fail(`${bytes.length - data - end} bytes follow its last tensor`);
  return {state, progress};
}
