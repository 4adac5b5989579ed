// Node: node load-cases.mjs <node|web> '<tryLoads' cases as JSON>' prints tryLoads' outcomes (load-cases.js) as JSON.
import {Trainer} from '../node.js';
import {runtime} from './runtime.mjs';
import {tryLoads} from './load-cases.js';

const [kind, cases] = process.argv.slice(2);
console.log(JSON.stringify(await tryLoads(Trainer, await runtime(kind), JSON.parse(cases))));
