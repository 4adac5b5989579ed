// webpack's configuration of the bundled example (app.js): `npx webpack` bundles it into dist/ (dist/app.js, and
// onnxruntime-web's engine, which webpack finds through its `new URL(..., import.meta.url)`); copy index.html beside.
export default {
  mode: 'production',
  entry: './app.js',
  output: {filename: 'app.js'},
  // onnxruntime-web's WebAssembly engine is 14 MB by design (3.7 MB gzipped): no warning about its size
  performance: {assetFilter: (name) => !name.endsWith('.wasm')},
};
