// The runtime a test script trains on: onnxruntime-node ("node") or onnxruntime-web's WebAssembly build in Node
// ("web", one thread).
import {createRequire} from 'node:module';

const require = createRequire(import.meta.url);

export async function runtime(kind) {
  if (kind === 'node') return require('onnxruntime-node');
  if (kind === 'web') {
    const ort = require('onnxruntime-web');
    ort.env.wasm.numThreads = 1;
    return ort;
  }
  throw new Error(`unknown runtime ${kind}: node or web`);
}
