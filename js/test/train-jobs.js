// One training job of the Python tests, shared by train-cases.mjs (Node) and train-cases.html (a browser): load the
// job's package (with `load`'s options), call fit once per entry of `fits` ([{epochs, shuffle, seed, sampleWeight}]),
// and give back {state: exportState(), model: exportModel(), report}; report (when the job has `predictX`) holds
// {values: predict(predictX), epochs: the onEpoch records, flat: whether step_flat.onnx ran, runs: the runtime runs
// fit made, unrolled: the steps of the unrolled graphs it had}.
export async function trainJob(Trainer, ort, job) {
  const trainer = await Trainer.load(job.package, {ort, ...(job.load || {})});
  try {
    const epochs = [];
    for (const options of job.fits || [{}]) {
      await trainer.fit(job.X, job.y, {...options, onEpoch: (r) => { epochs.push(r); }});
    }
    const report = job.predictX === undefined ? null : {values: await trainer.predict(job.predictX), epochs,
      flat: trainer.flat, runs: trainer.runs, unrolled: Array.from(trainer.unrolled.keys())};
    return {state: trainer.exportState(), model: trainer.exportModel(), report};
  } finally {
    await trainer.dispose();
  }
}
