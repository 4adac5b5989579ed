// Runs js/src/format.js on cases written by tests/test_package_format.py.
// Usage: node test/format.mjs <cases.json> <out.json>. cases.json: {manifests: [manifest, ...], manifest (a valid
// one), states: [base64 state file, ...], state: Float32Array values of the package's state.bin, progress}; a number
// written {"$number": "NaN" | "Infinity" | "-Infinity"} becomes that number (JSON cannot hold it). out.json:
// {manifests: [message or null], states: [message or null], decoded: {state, progress} of states[0] or its error,
// encoded: base64 of encodeState(manifest, state, progress), roles: inputsByRole(step_flat, r).map(name) by role,
// constants, graphs: [message or null] of checkGraph on cases.graphs ({file, entry, path})}.
import {readFile, writeFile} from 'node:fs/promises';
import {createRequire} from 'node:module';
import {FORMAT, FORMAT_VERSION, GENERATOR, STATE_FORMAT, TrainingPackageError, checkGraph, decodeState, encodeState,
  inputsByRole, validateManifest} from '../src/format.js';

const revive = (key, value) => (value && typeof value === 'object' && !Array.isArray(value) && '$number' in value ?
  Number(value.$number) : value);

const [casesFile, outFile] = process.argv.slice(2);
const cases = JSON.parse(await readFile(casesFile, 'utf8'), revive);

function attempt(run) {
  try {
    run();
    return null;
  } catch (err) {
    if (!(err instanceof TrainingPackageError)) return `not a TrainingPackageError: ${err.name}: ${err.message}`;
    return err.message;
  }
}

const b64 = (text) => new Uint8Array(Buffer.from(text, 'base64'));
const manifest = validateManifest(cases.manifest, 'manifest.json');
const out = {
  manifests: cases.manifests.map((m) => attempt(() => validateManifest(m, 'manifest.json'))),
  states: cases.states.map((s) => attempt(() => decodeState(b64(s), manifest))),
  constants: {FORMAT, FORMAT_VERSION, STATE_FORMAT, GENERATOR},
  roles: Object.fromEntries(['data', 'target', 'state', 'learning_rate', 'step'].map(
    (r) => [r, inputsByRole(manifest.step_flat, r).map((s) => s.name)])),
};
const decoded = decodeState(b64(cases.good_state), manifest);
out.decoded = {state: Array.from(decoded.state), progress: decoded.progress};
const encoded = encodeState(manifest, Float32Array.from(cases.state), cases.progress);
out.encoded = Buffer.from(encoded).toString('base64');
out.encodedOwnBuffer = encoded.byteOffset === 0 && encoded.buffer.byteLength === encoded.length;
// the graphs against their entries (cases.graphs: [{file, entry, path}], each a graph of the package on disk)
const ort = createRequire(import.meta.url)('onnxruntime-node');
out.graphs = [];
for (const g of cases.graphs) {
  const session = await ort.InferenceSession.create(await readFile(g.file));
  out.graphs.push(attempt(() => checkGraph(g.entry, session, g.path, 'manifest.json')));
}
await writeFile(outFile, JSON.stringify(out));
