"""The registered model's code: an MLflow ``PythonModel`` that runs the deploy graph with onnxruntime.

Logged as *models from code* (``mlflow.pyfunc.log_model(python_model=<this file>)``): MLflow copies this file
into the model and runs it at load time, so nothing is unpickled. It depends on numpy, pandas, onnxruntime
(the training build the model's requirements name) and MLflow only, never on the ``pipelines`` package, so
the model loads wherever its requirements are installed.

Input: a pandas DataFrame whose columns are the data's feature names; MLflow matches them by name against the
signature (any order, extra columns ignored) and casts them to float64; they reach the graph as float32 in the
graph's column order. Output, a DataFrame: ``prediction`` for a regressor; ``label`` (the classes as the data had
them) and ``probabilities`` (one list per row, in the order of the model config's ``classes``) for a classifier.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

#: the key of the deploy graph in the logged model's artifacts
GRAPH = "deploy_model"


class DeployedOnnxModel(PythonModel):
    """The deploy graph (raw features in, target units or class labels out) behind MLflow's pyfunc interface.

    ``model_config``: ``features`` (the column names, in the graph's order), ``task`` (``regression`` or
    ``classification``) and, for a classifier, ``classes``.
    """

    def load_context(self, context) -> None:
        import onnxruntime

        config = context.model_config
        self.features = [str(f) for f in config["features"]]
        self.task = str(config["task"])
        self.session = onnxruntime.InferenceSession(context.artifacts[GRAPH], providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.outputs = [o.name for o in self.session.get_outputs()]

    # no type hint on model_input: MLflow would take a DataFrame hint as "any" and stop enforcing the signature
    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        missing = [f for f in self.features if f not in frame.columns]
        if missing:
            raise ValueError(f"the input lacks the feature columns {missing}; the model takes {self.features}")
        X = frame[self.features].to_numpy(dtype=np.float32)
        if self.task == "classification":
            label, proba = self.session.run(["output_label", "output_probability"], {self.input_name: X})
            return pd.DataFrame({"label": np.asarray(label).ravel(),
                                 "probabilities": [row.astype(np.float64) for row in np.asarray(proba)]})
        prediction = self.session.run([self.outputs[0]], {self.input_name: X})[0]
        return pd.DataFrame({"prediction": np.asarray(prediction, dtype=np.float64).reshape(len(X), -1)[:, 0]})


set_model(DeployedOnnxModel())
