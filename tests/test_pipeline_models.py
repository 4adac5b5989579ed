"""Every ``model=`` config composes, validates, fits and converts: the ONNX graph predicts what the scikit-learn
model predicts on the test rows (probabilities for classifiers, the sigmoid of the decision function where the
estimator has no predict_proba)."""

from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from pipelines.base.config import validate
from pipelines.data.datasets import make_split
from pipelines.modeling.estimators import sklearn_predict
from pipelines.modeling.predictions import onnx_predict
from pipelines.stages.convert import fitted_estimator, prediction_graph

MODELS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "conf" / "model").glob("*.yaml"))
CLASSIFIERS = {"logistic", "mlp_classifier", "sgd_classifier", "linear_svc"}
#: the loss each model trains with in this test (its own where the registry has it)
LOSSES = {"huber": "loss.name=huber", "quantile": "loss.name=quantile", "linear_svc": "loss.name=squared_hinge"}


def test_the_configs_cover_the_estimators_of_the_issue():
    assert {"ridge", "lasso", "elastic_net", "sgd_regressor", "sgd_classifier", "huber", "quantile",
            "linear_svc", "mlp_regressor", "mlp_classifier"} <= set(MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_each_model_config_composes_and_converts(compose_pipeline, model):
    classifier = model in CLASSIFIERS
    cfg = compose_pipeline("data=breast_cancer" if classifier else "data=diabetes", f"model={model}",
                           LOSSES.get(model, "loss=log" if classifier else "loss=square"))
    validate(cfg)
    split = make_split(cfg.data)
    estimator = fitted_estimator(cfg, split)
    onx = prediction_graph(cfg, estimator, split)
    session = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = onnx_predict(session, split.X_test, split.task)
    theirs = sklearn_predict(estimator, split.X_test, split.task)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
