// The Node entry of ortflow's JavaScript library: everything index.js exports, and Trainer.load reads a package from a
// folder on disk (js/src/files-node.js) as well as from a URL.
import {registerFolderReader} from './src/files.js';
import {nodeFolderReader} from './src/files-node.js';

registerFolderReader(nodeFolderReader);

export * from './index.js';
