"""States back through the tracking server (issue 47, item 5): a real ``mlflow server`` (sqlite store, proxied
artifacts, the page's origin allowed by ``--cors-allowed-origins``) holds the smoke chain's registered version; the
browser examples (the plain page, the Web Worker page and the bundled app), served from another origin (127.0.0.2) in
headless Chromium, train the version's training package on the raw rows and log their states to runs through
MLflow's REST API (examples/browser/mlflow.js); ``python -m pipelines.import_states --run ... --experiment ... --tag
...`` registers a new version whose lineage names the runs."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from bench.portable import PageServer, open_page
from ortflow.package import load_training_state
from pipelines.data.datasets import Split
from pipelines.execution.bundle import Bundle
from pipelines.import_states import main
from pipelines.orchestration.chain import run_chain
from pipelines.server import MlflowServer

from js_support import CHROMIUM, JS_GROUP, bundle_example, linked_bundled_example, require_node

pytestmark = JS_GROUP
MODEL = "ortflow-smoke-regression-mlp_regressor"
PAGE_HOST = "127.0.0.2"  # not in MLflow's default CORS origins (localhost, 127.0.0.1): the option must name it
#: the example pages that log their state to the tracking server (the tag ortflow.client of each one's run); the
#: bundled app as esbuild builds it (tests/test_js_package.py trains each bundler's build)
PAGES = {"chromium": "examples/browser/index.html", "worker": "examples/browser/worker.html",
         "bundled": "bundled/index.html"}


@pytest.fixture
def served(compose_pipeline, clean_mlflow_env, tmp_path):
    """The page server (127.0.0.2) with the version's package and raw rows, and a tracking server allowing its
    origin that holds the smoke chain's version 1."""
    require_node()
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    package_dir, data_dir = tmp_path / "training_package", tmp_path / "data"  # the download lands there
    data_dir.mkdir()
    bundled = bundle_example(linked_bundled_example(tmp_path / "example"), "esbuild")
    with PageServer({"/package/": package_dir, "/input/": data_dir, "/bundled/": bundled}, host=PAGE_HOST) as page:
        server = MlflowServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server.db'}", workers=1,
                              cors_allowed_origins=page.url)
        server.start()
        try:
            overrides = ["experiment=smoke", f"mlflow.tracking_uri={server.url}"]
            result = run_chain(compose_pipeline(*overrides), work_dir=tmp_path / "chain")
            export_run = result.stage_run_ids["export"]
            mlflow.set_tracking_uri(server.url)
            mlflow.artifacts.download_artifacts(run_id=export_run, artifact_path="training_package",
                                                dst_path=str(tmp_path))
            split = Split.load(Bundle.from_run(export_run).path("split", "test"))
            X, y = split.raw_X(split.X_train), split.raw_y(split.y_train)
            (data_dir / "data.json").write_text(json.dumps({"X": np.asarray(X, np.float64).tolist(),
                                                            "y": np.asarray(y, np.float64).ravel().tolist()}))
            yield {"page": page, "server": server, "overrides": overrides, "export_run": export_run,
                   "client": MlflowClient(server.url), "package": package_dir, "rows": len(X)}
        finally:
            server.stop()


def _imports(client, experiment_id):
    return client.search_runs([experiment_id], "tags.`ortflow.stage` = 'import_states'")


@pytest.mark.slow
def test_the_pages_log_their_states_to_the_server_and_import_states_registers_them(served, capsys):
    client, page = served["client"], served["page"]
    query = (f"package=/package/&data=/input/data.json&epochs=2&autorun=1&tracking={served['server'].url}"
             f"&experiment=browser-states&sourceModel={MODEL}&sourceVersion=1")
    runs = {}
    for seed, (name, path) in enumerate(PAGES.items()):  # each its seed: import_states refuses a state given twice
        result = open_page(f"{page.url}/{path}?{query}&seed={seed}&tag=ortflow.client={name}", timeout=180)
        run_id = runs[name] = result["run"]["runId"]
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED", name
        assert run.data.tags["ortflow.client"] == name and run.data.tags["ortflow.source_version"] == "1"
        assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2], name
        # the state went through the server's artifact proxy and is the package's
        stored = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="state/trained.state")
        state = load_training_state(served["package"], stored)
        assert (state.epochs, state.rows) == (2, served["rows"]), name
        assert run.data.tags["ortflow.package_id"] == state.package.id, name

    # a run of the experiment without a state is named, before any run is made
    experiment = client.get_experiment_by_name("browser-states").experiment_id
    empty = client.create_run(experiment, tags={"ortflow.client": "chromium"}).info.run_id
    client.set_terminated(empty)
    source_experiment = client.get_run(served["export_run"]).info.experiment_id
    with pytest.raises(SystemExit) as stopped:
        main(["--experiment", "browser-states", "--tag", "ortflow.client=chromium", *served["overrides"],
              "promotion.register=always"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"the run {empty} has no state artifact 'state/trained.state'" in err and "Traceback" not in err, err
    assert _imports(client, source_experiment) == []

    client.set_tag(empty, "ortflow.client", "none")  # the plain page's run, and the bundled app's by its id
    main(["--run", runs["bundled"], "--experiment", "browser-states", "--tag", "ortflow.client=chromium",
          *served["overrides"], "promotion.register=always"])
    assert "registered version 2" in capsys.readouterr().out
    version = client.get_model_version(MODEL, "2")
    assert version.tags["ortflow.lineage.source_version"] == "1"
    imported = [runs["bundled"], runs["chromium"]]  # the runs named, then the experiment's
    assert version.tags["ortflow.lineage.state_runs"] == ",".join(imported)
    record = json.loads(version.tags["ortflow.lineage.states"])
    assert [(r["run_id"], r["rows"], r["epochs"]) for r in record] == [(r, served["rows"], 2) for r in imported]
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["imported_states"] == 2


@pytest.mark.parametrize("argv, expected", [
    (["--run", "nope"], "the run 'nope' is not in "),
    (["--run", "{one}", "--run", "{two}"], "the runs name the versions ['1', '2'] (ortflow.source_version tags): "
                                           "pass --version"),
    (["--version", "1", "--run", "{two}"], "the run {two} was trained from ortflow.source_version='2', not '1'"),
    (["--experiment", "states", "--tag", "client=nobody"], "no run of the experiment 'states' holds the tags "
                                                          "{{'client': 'nobody'}}"),
    (["--experiment", "missing"], "has no experiment 'missing' (--experiment)"),
    (["--experiment", "states", "--tag", "client"], "--tag 'client': write it key=value"),
])
def test_runs_that_cannot_be_imported_are_named_before_any_run(clean_mlflow_env, sqlite_uri, capsys, argv,
                                                               expected):
    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("states")
    runs = {name: client.create_run(experiment, tags={"ortflow.source_version": version, "client": "web"}).info.run_id
            for name, version in (("one", "1"), ("two", "2"))}
    with pytest.raises(SystemExit) as stopped:
        main([a.format(**runs) for a in argv] + ["experiment=smoke", f"mlflow.tracking_uri={sqlite_uri}"])
    assert stopped.value.code == 2
    assert expected.format(**runs) in capsys.readouterr().err
    assert len(client.search_runs([experiment, "0"])) == 2  # no run made
