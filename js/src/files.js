// A package's files, read from where it was loaded: a URL (fetch, in browsers and Node) or a folder (Node, by the
// reader js/node.js registers). Every name a manifest gives is a plain relative path inside the package, as Python's
// `ortflow.graph.editing.safe_join` requires: no `..` segment, no absolute name, no scheme, no backslash; a URL resolves to
// the package's own origin and path; a folder's file (symlinks followed) lies in the folder.

import {TrainingPackageError} from './format.js';

let folderReader = null;

/** Make `Trainer.load` read folders by `reader(folder) -> {where, read(name)}` (js/node.js registers Node's). */
export function registerFolderReader(reader) {
  folderReader = reader;
}

const SCHEME = /^[a-z][a-z0-9+.-]*:/i;
const PARENT = /^(\.|%2e)(\.|%2e)$/i; // a URL reads "%2e%2e" as ".."

/** `name` if it is a path inside the package `where`; else a TrainingPackageError naming why it is refused. */
export function checkFileName(name, where) {
  const refuse = (why) => {
    throw new TrainingPackageError(`the package ${where} names the file ${JSON.stringify(name)}, ${why}: a ` +
      'package reads only the files of its own folder');
  };
  if (typeof name !== 'string' || name === '') refuse('which is not a file name');
  if (name.includes('\0')) refuse('which holds a NUL character');
  if (SCHEME.test(name)) refuse('which has a scheme (an absolute URL)');
  if (name.startsWith('/')) refuse('an absolute name');
  if (name.includes('\\')) refuse('which holds a backslash');
  if (name.split('/').some((segment) => PARENT.test(segment))) refuse('a path through ".." (outside the package)');
  return name;
}

/** A reader of the package at `source`: {where, read(name) -> Promise<Uint8Array>}. */
export function packageReader(source) {
  const text = source instanceof URL ? source.href : String(source);
  const web = /^(https?|blob|data):/i.test(text);
  if (!web && folderReader && (text.startsWith('file:') || !SCHEME.test(text) || /^[a-z]:[\\/]/i.test(text))) {
    return folderReader(text);
  }
  const page = typeof location !== 'undefined' && location.href ? location.href : undefined;
  if (!web && !page) {
    throw new TrainingPackageError(`cannot read the package ${text}: a folder is read by the Node entry of this ` +
      "library (import 'ortflow', or js/node.js), a package served over HTTP by its http(s) URL");
  }
  return urlReader(new URL(text, page));
}

function urlReader(url) {
  const base = new URL(url.href);
  base.hash = '';
  base.search = '';
  if (!base.pathname.endsWith('/')) base.pathname += '/';
  const where = base.href;
  return {
    where,
    read: async (name) => {
      checkFileName(name, where);
      const target = new URL(name, base);
      if (target.origin !== base.origin || !target.pathname.startsWith(base.pathname)) {
        throw new TrainingPackageError(`the package ${where} names the file ${JSON.stringify(name)}, which resolves ` +
          `to ${target.href} outside the package`);
      }
      const response = await fetch(target);
      if (response.redirected && new URL(response.url).origin !== base.origin) {
        throw new TrainingPackageError(`${name} of the package ${where} was redirected to another origin ` +
          `(${response.url}): refused`);
      }
      if (!response.ok) {
        throw new TrainingPackageError(`cannot read ${name} of the package ${where}: HTTP ${response.status}`);
      }
      return new Uint8Array(await response.arrayBuffer());
    },
  };
}

/** The SHA-256 of `bytes` in hexadecimal. */
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}
