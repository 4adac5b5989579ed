"""The JavaScript library's entries (issue 44 item 4, issue 47 item 1): js/index.js, the browser entry, reaches no
``node:`` module through its imports (a bundler for the browser needs no flag); js/node.js exports the same names and
reads folders; js/index.js alone in Node names the Node entry when given a folder; package.json's conditional exports
send Node to node.js and browsers to index.js."""

from __future__ import annotations

import json
import re

from js_support import JS, JS_GROUP, make_package, node, require_node

pytestmark = JS_GROUP
IMPORT = re.compile(r"""^\s*(?:(?:import|export)\b[^'"]*?from\s+|import\s+)['"]([^'"]+)['"]|"""
                    r"""import\(\s*['"]([^'"]+)['"]\s*\)""", re.MULTILINE)


def _reachable(entry):
    seen, todo, specifiers = set(), [entry], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for match in IMPORT.finditer(path.read_text()):
            spec = match.group(1) or match.group(2)
            specifiers.add(spec)
            if spec.startswith("."):
                todo.append((path.parent / spec).resolve())
    return seen, specifiers


def test_browser_entry_imports_no_node_module():
    modules, specifiers = _reachable((JS / "index.js").resolve())
    assert {m.name for m in modules} >= {"index.js", "format.js", "shuffle.js", "schedules.js", "files.js", "data.js",
                                        "trainer.js"}
    assert not [s for s in specifiers if not s.startswith(".")], specifiers
    assert "files-node.js" not in {m.name for m in modules}
    _, node_specifiers = _reachable((JS / "node.js").resolve())
    assert "node:fs/promises" in node_specifiers
    exports = json.loads((JS / "package.json").read_text())["exports"]["."]
    assert (exports["browser"], exports["node"], exports["default"]) == ("./index.js", "./node.js", "./index.js")


def test_the_browser_entry_names_every_module_it_runs():
    """A page that imports js/index.js without a bundler fetches every module of the library one round trip after
    it (index.js names them all), not a chain of round trips (index.js -> trainer.js -> data.js...)."""
    index = (JS / "index.js").resolve()
    modules, _ = _reachable(index)
    named = {(index.parent / (m.group(1) or m.group(2))).resolve() for m in IMPORT.finditer(index.read_text())}
    assert modules - {index} == named, sorted(m.name for m in modules - {index} - named)


LOAD = """
import {createRequire} from 'node:module';
import * as entry from './%s';
const ort = createRequire(import.meta.url)('onnxruntime-node');
let message = null, loaded = false;
try { loaded = !!(await entry.Trainer.load(process.argv[1], {ort})).packageId; }
catch (e) { message = `${e.name}: ${e.message}`; }
console.log(JSON.stringify({names: Object.keys(entry).sort(), message, loaded}));
"""


def test_entries_export_the_same_api_and_only_node_reads_folders(tmp_path):
    require_node()
    folder, _, _ = make_package("linear", "sgd", tmp_path / "pkg")
    # one process each: index.js alone has no folder reader (node.js registers it)
    browser = json.loads(node("--input-type=module", "-e", LOAD % "index.js", str(folder)).stdout)
    assert not browser["loaded"]
    assert browser["message"].startswith("TrainingPackageError: cannot read the package") and \
        "Node entry" in browser["message"]
    got = json.loads(node("--input-type=module", "-e", LOAD % "node.js", str(folder)).stdout)
    assert got["loaded"] and got["names"] == browser["names"]
    assert {"Trainer", "TrainingPackageError", "ConcurrentFitError", "ConvergenceError", "FORMAT", "FORMAT_VERSION",
            "STATE_FORMAT", "GENERATOR", "epochOrder", "mulberry32", "seedState", "learningRateAt"} <= set(got["names"])
