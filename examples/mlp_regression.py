"""Full training of an MLPRegressor graph with Adam, a validation split and early stopping; exports the model.

Run: python -m examples.mlp_regression
"""

import tempfile

import warnings

import numpy as np
import onnxruntime as ort
from sklearn.exceptions import ConvergenceWarning
from sklearn.datasets import make_regression
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ortflow import LearningRateAdam, OrtGradientOptimizer, add_loss_output, to_onnx


def main(epochs: int = 40) -> dict:
    X, y = make_regression(2000, n_features=20, n_informative=10, noise=5.0, random_state=1)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    y = (y / y.std()).astype(np.float32)
    # One scikit-learn iteration gives the architecture and a random start.
    with warnings.catch_warnings():  # one iteration on purpose: it only gives the architecture
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = MLPRegressor(hidden_layer_sizes=(32, 16), max_iter=1, random_state=0).fit(X, y)
    graph = add_loss_output(to_onnx(start))
    trainer = OrtGradientOptimizer(graph, max_iter=epochs, batch_size=32, learning_rate=LearningRateAdam(eta0=3e-3),
                                   validation_fraction=0.2, early_stopping=True, n_iter_no_change=5,
                                   random_state=0)
    trainer.fit(X, y)
    with tempfile.TemporaryDirectory() as folder:
        paths = trainer.save_onnx_graph(folder)
        exported = ort.InferenceSession(paths["trained_model"], providers=["CPUExecutionProvider"])
        same = np.allclose(exported.run(None, {"X": X[:5]})[0].ravel(), trainer.predict(X[:5]), atol=1e-6)
    result = {
        "epochs": trainer.n_iter_,
        "first_loss": trainer.train_losses_[0],
        "last_loss": trainer.train_losses_[-1],
        "last_validation_loss": trainer.validation_losses_[-1],
        "graphs": sorted(paths),
        "exported_matches": same,
    }
    for key, value in result.items():
        print(f"{key:>20}: {value}")
    return result


if __name__ == "__main__":
    main()
