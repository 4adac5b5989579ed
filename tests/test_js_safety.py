"""Issue 45 item 4: the JavaScript Trainer.load reads no file outside the package, as Python's ``safe_join`` refuses
them: a manifest naming ``../outside/...``, an absolute name, a name with a scheme (``file:``, another origin's
``http:``), a protocol-relative ``//host/...``, a ``%2e%2e`` or backslash path, a symlink (a file or a folder)
leading out of the folder. Each "outside" file is a copy of the package's own predict.onnx listed with its true
checksum, so a library that read it would load the package: the refusal is the only thing that stops it. In Node
(folders, and URLs served on 127.0.0.1) and in headless Chromium; the second origin (another port on 127.0.0.1)
records every request and must see none, nor may the package's server see a request for a file outside the package.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from bench.portable import PageServer, open_page

from js_support import CHROMIUM, JS_GROUP, make_package, node, require_node

pytestmark = JS_GROUP


def _escaping(good: Path, dest: Path, name: str) -> Path:
    """A copy of ``good`` whose manifest reads its prediction graph from ``name``, with that file's true checksum."""
    shutil.copytree(good, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    entry = manifest["files"].pop(manifest["predict"]["file"])
    manifest["predict"]["file"] = name
    manifest["files"][name] = entry
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """pkgs/good, pkgs/<case> (manifests naming outside files), pkgs/outside/predict.onnx (the outside file, beside
    the packages), other/predict.onnx (served by the second origin)."""
    require_node()
    root = tmp_path_factory.mktemp("js_safety")
    pkgs = root / "pkgs"
    good, _, _ = make_package("linear", "sgd", pkgs / "good")
    predict = good / json.loads((good / "manifest.json").read_text())["predict"]["file"]
    for folder in (pkgs / "outside", root / "other"):
        folder.mkdir()
        shutil.copy(predict, folder / "predict.onnx")
    assert hashlib.sha256(predict.read_bytes()).hexdigest() in (good / "manifest.json").read_text()
    with PageServer({"/pkgs/": pkgs}) as server, PageServer({"/": root / "other"}) as other:
        yield {"root": root, "pkgs": pkgs, "good": good, "server": server, "other": other}


def _url_cases(site) -> dict:
    pkgs, other = site["pkgs"], site["other"].url
    names = {"dotdot": "../outside/predict.onnx", "absolute_path": "/pkgs/outside/predict.onnx",
             "other_origin": f"{other}/predict.onnx",
             "protocol_relative": "//" + other.split("//")[1] + "/predict.onnx",
             "encoded_dotdot": "%2e%2e/outside/predict.onnx", "backslash": "..\\outside\\predict.onnx"}
    cases = {"good": f"{site['server'].url}/pkgs/good/"}
    for case, name in names.items():
        if not (pkgs / f"url_{case}").exists():
            _escaping(site["good"], pkgs / f"url_{case}", name)
        cases[case] = f"{site['server'].url}/pkgs/url_{case}/"
    return cases


def _check_refused(outcomes: dict, cases: dict) -> None:
    assert outcomes["good"]["loaded"], outcomes["good"]
    loaded = [case for case in cases if case != "good" and outcomes[case]["loaded"]]
    assert not loaded, f"these packages loaded, reading a file outside them: {loaded}"
    for case in cases:
        if case == "good":
            continue
        outcome = outcomes[case]
        assert outcome["name"] == "TrainingPackageError", outcome
        assert "outside" in outcome["message"] or "a package reads only the files of its own folder" in \
            outcome["message"], outcome


def _no_request_outside(site) -> None:
    assert site["other"].requests == [], site["other"].requests
    assert not [r for r in site["server"].requests if "/outside/" in r], site["server"].requests


def test_node_folder_refuses_files_outside(site):
    root, pkgs, good = site["root"], site["pkgs"], site["good"]
    outside = pkgs / "outside" / "predict.onnx"
    cases = {"good": str(good),
             "dotdot": _escaping(good, root / "folder_dotdot", "../pkgs/outside/predict.onnx"),
             "absolute": _escaping(good, root / "folder_absolute", str(outside)),
             "file_scheme": _escaping(good, root / "folder_scheme", outside.as_uri())}
    linked = shutil.copytree(good, root / "folder_symlink")
    predict = json.loads((good / "manifest.json").read_text())["predict"]["file"]
    (linked / predict).unlink()
    os.symlink(outside, linked / predict)  # the same bytes: only the symlink check refuses it
    cases["symlink"] = linked
    folder_link = _escaping(good, root / "folder_linked_dir", "sub/predict.onnx")
    os.symlink(pkgs / "outside", folder_link / "sub")
    cases["symlink_folder"] = folder_link
    inside = _escaping(good, root / "folder_inside_link", "sub/predict.onnx")
    os.symlink(inside / "sub_real", inside / "sub")
    (inside / "sub_real").mkdir()
    shutil.copy(outside, inside / "sub_real" / "predict.onnx")
    cases["good_inside_link"] = inside  # a link that stays inside the folder is fine
    outcomes = json.loads(node("test/load-cases.mjs", "node", json.dumps({k: str(v) for k, v in cases.items()})).stdout)
    assert outcomes.pop("good_inside_link")["loaded"]
    cases.pop("good_inside_link")
    _check_refused(outcomes, cases)
    assert "is a link to" in outcomes["symlink"]["message"]


def test_node_url_refuses_files_outside(site):
    cases = _url_cases(site)
    outcomes = json.loads(node("test/load-cases.mjs", "node", json.dumps(cases)).stdout)
    _check_refused(outcomes, cases)
    _no_request_outside(site)


def test_chromium_refuses_files_outside(site):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    cases = _url_cases(site)
    page = open_page(f"{site['server'].url}/js/test/load-cases.html?cases={quote(json.dumps(cases))}", timeout=120)
    _check_refused(page["outcomes"], cases)
    _no_request_outside(site)
