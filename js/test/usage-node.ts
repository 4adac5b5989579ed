// What examples/node/train.mjs does, in TypeScript: type-checked by `tsc --noEmit --strict` in js/
// (tests/test_js_package.py; onnxruntime-node is a devDependency there). Never run.
import * as ort from 'onnxruntime-node';
import {Trainer} from 'ortflow';

export async function train(folder: string, X: number[][], y: string[]): Promise<Uint8Array<ArrayBuffer>> {
  const trainer = await Trainer.load(folder, {ort, sessionOptions: {intraOpNumThreads: 1}, unrolled: false});
  await trainer.fit(X, y, {epochs: 2, seed: 5, onEpoch: ({epoch, loss, learningRate}) => console.log(
    `epoch ${epoch}: loss ${loss.toPrecision(6)}, learning rate ${learningRate.toPrecision(4)}`)});
  const model = trainer.exportModel();
  console.log(model.byteLength, trainer.manifest.optimizer);
  return trainer.exportState();
}
