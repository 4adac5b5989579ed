// Trainer.load on each of `cases` ({name: folder or URL, or {package: folder or URL, state: a state file in base64}:
// its trainer then loads that state}): {name: {loaded} or {name, message} of the error}. Shared by load-cases.mjs
// (Node) and load-cases.html (a browser) for tests/test_js_safety.py and tests/test_js_errors.py.
export async function tryLoads(Trainer, ort, cases) {
  const out = {};
  for (const [name, source] of Object.entries(cases)) {
    try {
      const trainer = await Trainer.load(source.package ?? source, {ort});
      if (source.state) trainer.loadState(Uint8Array.from(atob(source.state), (c) => c.charCodeAt(0)));
      out[name] = {loaded: true, bytes: trainer.exportModel().length};
      await trainer.dispose();
    } catch (err) {
      out[name] = {loaded: false, name: err.name, message: err.message};
    }
  }
  return out;
}
