// The folder reader of Node (js/node.js registers it): a package's files read from disk, each name checked by
// files.js's rules and its real path (symlinks followed) inside the folder's real path.

import {readFile, realpath} from 'node:fs/promises';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {TrainingPackageError} from './format.js';
import {checkFileName} from './files.js';

/** A reader of the package in `source` (a folder path or a file: URL): {where, read(name) -> Promise<Uint8Array>}. */
export function nodeFolderReader(source) {
  const folder = source.startsWith('file:') ? fileURLToPath(source) : source;
  let root = null;
  return {
    where: folder,
    read: async (name) => {
      checkFileName(name, folder);
      let real;
      try {
        root = root || await realpath(folder);
        real = await realpath(path.join(root, name));
      } catch (err) {
        throw new TrainingPackageError(`cannot read ${name} of the package ${folder}: ${err.message}`);
      }
      if (!real.startsWith(root.endsWith(path.sep) ? root : root + path.sep)) {
        throw new TrainingPackageError(`${name} of the package ${folder} is a link to ${real}, outside the ` +
          'package folder: refused');
      }
      try {
        return new Uint8Array(await readFile(real));
      } catch (err) {
        throw new TrainingPackageError(`cannot read ${name} of the package ${folder}: ${err.message}`);
      }
    },
  };
}
