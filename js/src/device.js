// Device failures of the execution providers that run on a GPU (onnxruntime-web's `webgpu`): a run whose results
// can't be trusted stops the fit with an ExecutionProviderError naming the providers, and its state is not kept.
// Seen on onnxruntime-web 1.30: a node over the device's storage-buffer limit makes the native WebGPU build throw
// from the run, and the JSEP build (ort.all / ort.min) return zeros while the device reports validation errors.

import {inputsByRole} from './format.js';

/** An execution provider failed (a run threw there, the WebGPU device reported an error, or a run gave an all-zero
 * state from a non-zero one): `executionProviders` names the providers the sessions were created with. */
export class ExecutionProviderError extends Error {
  constructor(message, {executionProviders, cause} = {}) {
    super(message, cause === undefined ? undefined : {cause});
    this.name = 'ExecutionProviderError';
    this.executionProviders = executionProviders;
  }
}

const HOST_PROVIDERS = ['cpu', 'wasm'];

/** A watch over the device of `executionProviders` (session options' list: names or {name, ...}), or null when
 * they all run on the CPU: the WebGPU device's `uncapturederror` events are recorded from now on (the device is
 * onnxruntime-web's `ort.env.webgpu.device`, set once a session runs on it). `stop()` removes the listener. */
export async function watchDevice(ort, executionProviders) {
  const names = (executionProviders || []).map((p) => (typeof p === 'string' ? p : p && p.name));
  if (names.every((name) => HOST_PROVIDERS.includes(name))) return null;
  const watch = {names, errors: [], stop: () => {}};
  if (names.includes('webgpu')) {
    let device = null;
    try {
      device = await (ort.env && ort.env.webgpu ? ort.env.webgpu.device : null);
    } catch {
      device = null;  // no WebGPU device (the session runs on the next provider)
    }
    if (device && typeof device.addEventListener === 'function') {
      const listen = (event) => watch.errors.push(event.error ? event.error.message : String(event));
      device.addEventListener('uncapturederror', listen);
      watch.stop = () => device.removeEventListener('uncapturederror', listen);
    }
  }
  return watch;
}

function allZero(arrays) {
  return arrays.every((a) => Array.prototype.every.call(a, (v) => v === 0));
}

/** The state tensors' values a run of `plan` (trainer.js's graph plan) takes from `feeds` and gives in `out`. */
function stateOf(plan, feeds, out) {
  if (plan.stateOut) {
    const input = inputsByRole(plan.entry, 'state')[0];
    return [[feeds[input.name].data], out[plan.stateOut] ? [out[plan.stateOut].data] : null];
  }
  return [plan.tensors.map((n) => feeds[n].data),
    plan.updated.every((n) => out[n]) ? plan.updated.map((n) => out[n].data) : null];
}

/** `session.run(feeds, fetches)` of `plan`'s graph, checked when `watch` (watchDevice's) is not null: a run that
 * throws, a device error reported by then, an all-zero state from a non-zero one (what no step gives) throw an
 * ExecutionProviderError naming the providers; the caller keeps the state it had. */
export async function watchedRun(watch, session, feeds, plan, fetches) {
  if (!watch) return session.run(feeds, fetches);
  const file = plan.entry.file;
  const where = `the execution providers ${JSON.stringify(watch.names)}`;
  let out;
  try {
    out = await session.run(feeds, fetches);
  } catch (err) {
    throw new ExecutionProviderError(`${file} failed to run on ${where}: ${err.message}`,
      {executionProviders: watch.names, cause: err});
  }
  if (watch.errors.length) {
    const errors = watch.errors.splice(0);
    throw new ExecutionProviderError(`the WebGPU device reported ${errors.length} error(s) while ${file} ran on ` +
      `${where}, so its results can't be trusted: ${errors[0]} (training stopped, the state is the one before ` +
      'this run; try executionProviders: [\'wasm\'])', {executionProviders: watch.names});
  }
  const [before, after] = stateOf(plan, feeds, out);
  if (after && allZero(after) && !allZero(before)) {
    throw new ExecutionProviderError(`${file} returned an all-zero state from a non-zero one on ${where}: the ` +
      'device failed (no training step gives that; training stopped, the state is the one before this run; try ' +
      'executionProviders: [\'wasm\'])', {executionProviders: watch.names});
  }
  return out;
}
