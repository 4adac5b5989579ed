// What the test pages under js/test/ train with: onnxruntime-web's wasm-only build on one thread, and the Trainer.
export async function pageRuntime() {
  const ortBase = new URL('../node_modules/onnxruntime-web/dist/', import.meta.url).href;
  const ort = await import(ortBase + 'ort.wasm.min.mjs');
  ort.env.wasm.wasmPaths = ortBase;
  ort.env.wasm.numThreads = 1;
  const {Trainer} = await import('../index.js');
  return {ort, Trainer};
}
