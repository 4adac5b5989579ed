"""Every ``model=`` config composes, validates, fits and converts: the ONNX graph predicts what the scikit-learn
model predicts on the test rows (probabilities for classifiers, the sigmoid of the decision function where the
estimator has no predict_proba)."""

from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from pipelines.base.checks import validate
from pipelines.data.datasets import make_split
from pipelines.modeling.estimators import sklearn_predict, with_mean
from pipelines.modeling.predictions import onnx_predict
from pipelines.stages.convert import fitted_estimator, prediction_graph

#: the configs of scikit-learn estimators (``model=onnx`` loads a graph: tests/test_pipeline_onnx_model.py)
MODELS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "conf" / "model").glob("*.yaml")
                if p.stem != "onnx")
CLASSIFIERS = {"logistic", "mlp_classifier", "sgd_classifier", "linear_svc"}
#: the loss each model trains with in this test (its own where the registry has it)
LOSSES = {"huber": "loss.name=huber", "quantile": "loss.name=quantile", "linear_svc": "loss.name=squared_hinge",
          "poisson": "loss.name=poisson"}
#: settings a model needs besides its loss
EXTRA = {"poisson": ("data.standardize_target=false",)}


def test_the_configs_cover_the_estimators_of_the_issue():
    assert {"ridge", "lasso", "elastic_net", "sgd_regressor", "sgd_classifier", "huber", "poisson", "quantile",
            "linear_svc", "mlp_regressor", "mlp_classifier"} <= set(MODELS)


def test_poisson_keeps_its_target_s_units(compose_pipeline):
    from pipelines.base.schema import ConfigError

    with pytest.raises(ConfigError, match=r"model=poisson .*data.standardize_target=false"):
        validate(compose_pipeline("data=diabetes", "model=poisson", "loss.name=poisson"))


@pytest.mark.parametrize("model", MODELS)
def test_each_model_config_composes_and_converts(compose_pipeline, model):
    classifier = model in CLASSIFIERS
    cfg = compose_pipeline("data=breast_cancer" if classifier else "data=diabetes", f"model={model}",
                           LOSSES.get(model, "loss=log" if classifier else "loss=square"), *EXTRA.get(model, ()))
    validate(cfg)
    split = make_split(cfg.data)
    estimator = fitted_estimator(cfg, split)
    onx = with_mean(prediction_graph(cfg, estimator, split))  # a GLM's graph: exp of its linear predictor
    session = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = onnx_predict(session, split.X_test, split.task)
    theirs = sklearn_predict(estimator, split.X_test, split.task)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_poisson_chain_answers_the_mean(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """The trained graph outputs the linear predictor (what loss.name=poisson trains); the deployed model answers
    its exponential, as PoissonRegressor.predict does: test metrics next to scikit-learn's."""
    from pipelines.orchestration.chain import run_chain

    cfg = compose_pipeline("data=diabetes", "model=poisson", "loss.name=poisson", "data.standardize_target=false",
                           "trainer.max_iter=5", "trainer.learning_rate=0.0001", f"mlflow.tracking_uri={sqlite_uri}",
                           f"mlflow.root={tmp_path}", "stages=[convert,add_loss,train,evaluate]")
    metrics = run_chain(cfg, work_dir=tmp_path / "chain").metrics
    assert metrics["test_mae"] == pytest.approx(metrics["sklearn_test_mae"], rel=0.05)


def test_pipelines_default_penalty_follows_the_naming_rule(regression_data):
    """The pipelines penalize every coefficient matrix by default: ``coef`` of a linear model, ``coef_<i>`` of an MLP.
    (In the pipeline tests: the core suite runs without omegaconf.)"""
    import warnings

    from omegaconf import OmegaConf
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPRegressor

    from ortflow import to_onnx
    from pipelines.base.builders import penalty

    X, y = regression_data
    cfg = OmegaConf.create({"penalty": {"name": "elastic", "l1": 0.1, "l2": 0.2, "weights": None}})
    linear = to_onnx(LinearRegression().fit(X, y))
    with warnings.catch_warnings():  # two iterations: the graph's names are what matters
        warnings.simplefilter("ignore")
        mlp = to_onnx(MLPRegressor(hidden_layer_sizes=(3,), max_iter=2, random_state=0).fit(X, y))
    built = penalty(cfg, [i.name for i in linear.graph.initializer])
    assert (type(built).__name__, built.l1, built.l2, built.weights) == ("ElasticLearningPenalty", 0.1, 0.2, ["coef"])
    assert penalty(cfg, [i.name for i in mlp.graph.initializer]).weights == ["coef_0", "coef_1"]


def test_the_table_of_models_and_the_conf_files_agree():
    """One table of models: each conf/model/<name>.yaml has its line (and no line lacks its file), with the same
    task, and every setting its file sets is one its class receives."""
    from omegaconf import OmegaConf

    from pipelines.base.schema import MODEL_TASK, ModelKind
    from pipelines.base.models import MODELS

    files = {p.stem: OmegaConf.load(p) for p in (Path(__file__).resolve().parent.parent / "conf" / "model").glob("*.yaml")}
    assert set(files) == {m.name for m in MODELS} == {k.value for k in ModelKind}
    for model in MODELS:
        if model.task is None:  # model=onnx: the data's task, no estimator
            assert ModelKind(model.name) not in MODEL_TASK and model.estimator is None
            continue
        assert files[model.name].task == model.task == MODEL_TASK[ModelKind(model.name)].value
        unused = set(files[model.name]) - {"name", "task", "target_opset", "defaults", *model.settings}
        assert not unused, f"conf/model/{model.name}.yaml sets {unused}, which its class never receives"
