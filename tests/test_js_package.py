"""The npm package (js/) as npm users get it (issue 47): its package.json follows npm's conventions, the typings
declare what the entries export and accept what the examples do (TypeScript 5.9 and 7.0, ``--strict``), the browser
entry bundles for the browser with no flags (esbuild, webpack), and the packed tarball installs into a new project
beside onnxruntime-web alone with install scripts on (no onnxruntime-node), bundles with esbuild, Vite and webpack
(the example's webpack.config.mjs), type-checks, and
its bundled pages (examples/browser/bundled) and README.md's plain page train a package in headless Chromium and send
the state back: the weights Python's reference loop reaches (the rule of tests/js_support.py).

npm 11 runs no dependency's install script unless allowed: ``--dangerously-allow-all-scripts`` runs them all, as
npm 10 and earlier did. npm's own cache (``~/.npm``, ``--prefer-offline``) makes a rerun quick; the registry is the
only network these tests need."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from bench.portable import PageServer, open_page
from ortflow.package import load_training_state, train_package

from js_support import (BUNDLERS, CHROMIUM, ESBUILD, JS, JS_GROUP, NODE, NPM, ROOT, WEBPACK, bundle_example,
                        copy_bundled_example, make_package, require_node, run_tool, weights_atol)

pytestmark = JS_GROUP
META = json.loads((JS / "package.json").read_text())
TSC = {"5.9": JS / "node_modules" / "typescript" / "bin" / "tsc", "7.0": JS / "node_modules" / "typescript7" / "bin" / "tsc"}
#: the compiler options of a browser app (the same for both compilers)
TSC_ARGS = ("--noEmit", "--strict", "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler",
            "--lib", "es2022,dom")
FIT = {"epochs": 3, "seed": 11, "shuffle": True}


def require_npm() -> None:
    require_node()
    if NPM is None:
        pytest.skip("npm is not installed: the packaging tests need it (Node 20 brings it)")
    if not all((JS / "node_modules" / name / "package.json").is_file() for name in META["devDependencies"]):
        # a node_modules installed before these tools joined the lockfile: `make` reinstalls it, so does this
        subprocess.run([NPM, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=JS, check=True,
                       capture_output=True)


def packed_files() -> list[str]:
    """The files `npm pack` puts in the tarball."""
    require_npm()
    [pack] = json.loads(run_tool(NPM, "pack", "--dry-run", "--json", "--ignore-scripts", cwd=JS))
    return sorted(f["path"] for f in pack["files"])


# --- package.json, the tarball's contents -------------------------------------------------------------------
def test_package_json_follows_npm_conventions():
    assert "private" not in META, "npm refuses to publish a private package"
    assert META["license"] == "MIT" == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert (JS / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    # the caller passes the runtime in: both are optional peers, never installed for the user
    assert "dependencies" not in META
    runtimes = {"onnxruntime-node", "onnxruntime-web"}
    assert set(META["peerDependencies"]) == runtimes
    assert all(META["peerDependenciesMeta"][name] == {"optional": True} for name in runtimes)
    assert runtimes <= set(META["devDependencies"])
    for name, version in META["devDependencies"].items():  # exact pins: the lockfile's versions, reproducible
        assert re.fullmatch(r"(npm:[\w@/.-]+@)?\d+\.\d+\.\d+", version), (name, version)
    assert META["exports"]["."] == {"types": "./index.d.ts", "browser": "./index.js", "node": "./node.js",
                                    "default": "./index.js"}
    assert list(META["exports"]["."])[0] == "types", "TypeScript reads the first matching condition"
    lock = json.loads((JS / "package-lock.json").read_text())["packages"]
    assert {k: v for k, v in lock[""].items() if k in META} == {k: v for k, v in META.items() if k in lock[""]}
    assert not any(lock[f"node_modules/{name}"].get("dev") is not True for name in runtimes)


def test_tarball_ships_the_library_and_no_tests():
    files = packed_files()
    assert {"package.json", "README.md", "LICENSE", "index.js", "index.d.ts", "node.js"} <= set(files)
    shipped_src = {f for f in files if f.startswith("src/")}
    assert shipped_src == {p.relative_to(JS).as_posix() for p in (JS / "src").rglob("*") if p.is_file()}
    assert not [f for f in files if f.startswith(("test/", "bench/")) or f.endswith((".ts", ".tgz"))
                and f != "index.d.ts"]


def test_readme_stands_alone_in_the_tarball():
    """Every relative link of js/README.md names a file of the tarball (the repository's docs by full URL)."""
    files = set(packed_files())
    text = (JS / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:|#", link)]
    assert all(link in files for link in relative), [link for link in relative if link not in files]
    for needed in ("npm i ortflow onnxruntime-web", "onnxruntime-web/wasm", "exportState()", "ort.wasm.min.mjs"):
        assert needed in text, needed


# --- the typings ----------------------------------------------------------------------------------------------
def declared_members(text: str, cls: str) -> set[str]:
    """The members the class ``cls`` of a .d.ts declares (one per line, the file's style)."""
    body = text[text.index(f"export class {cls} "):]
    body = body[:body.index("\n}\n")]
    return set(re.findall(r"^  (?:static |readonly )*(\w+)[?]?[(:<]", body, re.M))


def test_typings_declare_what_the_entries_export(tmp_path):
    """index.d.ts declares the values index.js exports, and the Trainer's members that a loaded trainer has (its
    fields, methods and getters; `_` ones are private), so the typings follow the code."""
    require_npm()
    folder, _, _ = make_package("linear", "sgd", tmp_path / "package")
    script = """
      const names = async (f) => Object.keys(await import(new URL(f, `file://${process.cwd()}/`).href)).sort();
      const ort = (await import('onnxruntime-node')).default;
      const {Trainer} = await import(new URL('node.js', `file://${process.cwd()}/`).href);
      const trainer = await Trainer.load(process.argv[1], {ort});
      const own = (o) => Object.getOwnPropertyNames(o).filter((k) => !k.startsWith('_') && k !== 'constructor');
      const members = [...own(trainer), ...own(Trainer.prototype), ...own(Trainer).filter((k) => typeof Trainer[k] === 'function')];
      console.log(JSON.stringify({index: await names('index.js'), members}));
    """
    found = json.loads(run_tool(NODE, "--input-type=module", "-e", script, folder, cwd=JS))
    text = (JS / "index.d.ts").read_text()
    declared = sorted(re.findall(r"^export (?:const|class|function) (\w+)", text, re.M))
    assert declared == found["index"], "index.d.ts and index.js export different values"
    assert declared_members(text, "Trainer") == set(found["members"]), "index.d.ts's Trainer differs from the code's"


#: the interfaces of index.d.ts that type the manifest's records, and the records of the format's schema they type
MANIFEST_TYPES = {"Manifest": "Manifest", "TensorSpec": "TensorSpec", "StepGraph": "StepGraph",
                  "FlatStepGraph": "FlatStepGraph", "UnrolledGraph": "UnrolledGraph", "Target": "Target", "Loss": "Loss",
                  "Optimizer": "Optimizer", "Schedule": "Schedule", "StateTable": "StateTable",
                  "StateTensor": "StateTensor", "Progress": "Progress", "WeightPatch": "Patch",
                  "PredictGraph": "PredictGraph", "LossModel": "LossModel", "Shuffle": "Shuffle", "FileEntry": "FileEntry",
                  "Preprocess": "Preprocess", "Affine": "Affine", "CreatedWith": "CreatedWith"}


def interface_fields(text: str, name: str) -> dict[str, bool]:
    """{field: optional} of an interface of index.d.ts (one field per line), with those of the one it extends."""
    head = re.search(rf"^export interface {name}(?: extends (\w+))? {{\n(.*?)^}}", text, re.M | re.S)
    fields = interface_fields(text, head.group(1)) if head.group(1) else {}
    fields.update({m.group(1): bool(m.group(2)) for m in re.finditer(r"^  (\w+)(\?)?:", head.group(2), re.M)})
    return fields


def test_manifest_typings_follow_the_format_schema():
    """Each manifest record of index.d.ts has the fields of the schema's record, optional where the schema does not
    require them (src/manifest.schema.json, generated from Python's one definition of the format)."""
    schema_file = JS / "src" / "manifest.schema.json"
    if not schema_file.is_file():
        pytest.skip("js/src/manifest.schema.json is not generated in this tree")
    records = json.loads(schema_file.read_text())["$defs"]
    text = (JS / "index.d.ts").read_text()
    for ours, theirs in MANIFEST_TYPES.items():
        record = records[theirs]
        expected = {field: field not in record.get("required", []) for field in record["properties"]}
        assert interface_fields(text, ours) == expected, ours
    assert set(MANIFEST_TYPES.values()) >= set(records) - {"StateHeader", "StateEntry"}, "a record without typings"


@pytest.mark.parametrize("version", sorted(TSC))
def test_usage_type_checks_strict(version):
    """test/usage.ts (and test/usage-node.ts) do what the examples do: `new Blob([trainer.exportState()])`, a fetch
    body, a transferred buffer, `manifest.metadata.standardization`, callbacks, errors; its `@ts-expect-error` lines
    fail the check if the typings accept anything."""
    require_npm()
    run_tool(NODE, TSC[version], *TSC_ARGS, "test/usage.ts", "test/usage-node.ts", cwd=JS)


# --- bundling ---------------------------------------------------------------------------------------------------
def entry_modules(bundler: str, out: Path) -> list[str]:
    """The modules ``bundler`` takes in when it bundles the browser entry (index.js) for the browser with no option
    beyond the entry and the output (webpack's mode: it warns when none is set), failing on any warning."""
    if bundler == "esbuild":
        log = run_tool(ESBUILD, "index.js", "--bundle", "--format=esm", "--platform=browser",
                       f"--outfile={out / 'out.js'}", f"--metafile={out / 'meta.json'}", cwd=JS)
        assert "warning" not in log.lower(), log
        inputs = json.loads((out / "meta.json").read_text())["inputs"]
        return [*inputs, *(i["path"] for entry in inputs.values() for i in entry["imports"])]
    run_tool(NODE, WEBPACK, "--entry", "./index.js", "--mode", "production", "--output-path", out,
             "--json", out / "stats.json", cwd=JS)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["warnings"] == [] == stats["errors"], stats["warnings"] + stats["errors"]
    return [module["name"] for module in stats["modules"]]


@pytest.mark.parametrize("bundler", ["esbuild", "webpack"])
def test_browser_entry_bundles_with_no_node_module(tmp_path, bundler):
    """(Vite bundles the entry in the bundled example's build below.)"""
    require_npm()
    modules = entry_modules(bundler, tmp_path)
    assert any(name.endswith("src/trainer.js") for name in modules), modules
    assert not [name for name in modules if name.startswith("node:")]


# --- the tarball in a new project, bundled, trained in Chromium -------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A new project with the packed tarball and onnxruntime-web installed (install scripts on), the bundled example
    copied in."""
    require_npm()
    tmp = tmp_path_factory.mktemp("npm")
    tarball = tmp / json.loads(run_tool(NPM, "pack", "--json", "--ignore-scripts", "--pack-destination", tmp,
                                        cwd=JS))[0]["filename"]
    project = copy_bundled_example(tmp)
    (project / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    shutil.copy(JS / "test" / "usage.ts", project / "usage.ts")
    web = f"onnxruntime-web@{META['devDependencies']['onnxruntime-web']}"
    run_tool(NPM, "install", "--dangerously-allow-all-scripts", "--prefer-offline", "--no-audit", "--no-fund", tarball,
             web, cwd=project, timeout=600)
    return project


@pytest.mark.slow
def test_tarball_installs_beside_onnxruntime_web_alone(app):
    installed = app / "node_modules"
    assert (installed / "ortflow" / "package.json").is_file() and (installed / "onnxruntime-web").is_dir()
    assert not (installed / "onnxruntime-node").exists(), "a browser app got onnxruntime-node (437 MB, CUDA script)"
    run_tool(NODE, TSC["5.9"], *TSC_ARGS, "usage.ts", cwd=app)
    # the Node entry reads a package from a folder; import by the package's name picks it
    out = run_tool(NODE, "--input-type=module", "-e",
                   "import * as o from 'ortflow'; console.log(JSON.stringify(Object.keys(o)))", cwd=app)
    assert "Trainer" in json.loads(out)


@pytest.fixture(scope="module", params=BUNDLERS)
def bundle(request, app):
    """The bundled example built by each bundler (js_support.bundle_example: no warning, no option)."""
    return bundle_example(app, request.param)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder, X, y = make_package("mlp", "adam", tmp_path_factory.mktemp("package") / "package")
    data = folder.parent / "data"
    data.mkdir()
    (data / "data.json").write_text(json.dumps({"X": X.tolist(), "y": y.tolist()}))
    return {"folder": folder, "data": data, "X": X, "y": y,
            "reference": train_package(folder, X, y, **FIT)}


@pytest.mark.slow
def test_bundled_page_trains_in_chromium_and_sends_the_state_back(bundle, site):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    # "/" (the bundle) last: the first matching prefix serves
    with PageServer({"/package/": site["folder"], "/input/": site["data"], "/": bundle}) as server:
        query = f"package=/package/&data=/input/data.json&epochs={FIT['epochs']}&seed={FIT['seed']}&post=/state"
        page = open_page(f"{server.url}/index.html?{query}", timeout=120)
        posted = server.posted
    losses = page["history"]["history"]["loss"]
    assert len(losses) == FIT["epochs"] and losses[-1] < losses[0]
    assert posted is not None, "the page sent no state"
    state, reference = load_training_state(site["folder"], posted), site["reference"]
    assert (state.epochs, state.steps, state.rows_seen) == (reference.epochs, reference.steps, reference.rows_seen)
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=name)


@pytest.mark.slow
def test_readmes_plain_page_trains_from_the_installed_package(app, site):
    """js/README.md's plain page (no bundler), as written, served beside the installed node_modules; a line added
    after it POSTs the state and reports the end."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    readme = (JS / "README.md").read_text()
    [snippet] = re.findall(r"```html\n(.*?)```", readme, re.S)
    report = ("await fetch('/state', {method: 'POST', body: trainer.exportState()});\n"
              "  window.ortflowResult = {log: document.getElementById('log').textContent};\n</script>")
    (app / "plain.html").write_text(f"<!doctype html>\n<meta charset=\"utf-8\">\n{snippet.replace('</script>', report)}")
    with PageServer({"/package/": site["folder"], "/data.json": site["data"] / "data.json", "/": app}) as server:
        page = open_page(f"{server.url}/plain.html", timeout=120)
        posted = server.posted
    losses = [float(line.split(": ")[1]) for line in page["log"].splitlines()]
    assert len(losses) == 5 and losses[-1] < losses[0]
    state = load_training_state(site["folder"], posted)
    reference = train_package(site["folder"], site["X"], site["y"], epochs=5, seed=0, shuffle=True)
    assert state.steps == reference.steps
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=name)
