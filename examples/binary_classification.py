"""Full training of a logistic regression on its raw score with the binary log loss.

The exported graph still predicts labels and probabilities. Run: python -m examples.binary_classification
"""

import warnings

import numpy as np
import onnxruntime as ort
from sklearn.exceptions import ConvergenceWarning
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx


def main(epochs: int = 30) -> dict:
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, stratify=y, random_state=0)
    reference = LogisticRegression(max_iter=1000).fit(X_train, y_train)
    with warnings.catch_warnings():  # one iteration on purpose: it only gives the architecture
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = LogisticRegression(max_iter=1).fit(X_train[:40], y_train[:40])
    graph = add_loss_output(to_onnx(start), "log", penalty={"coef": {"l2": 1e-3}})
    trainer = OrtGradientOptimizer(graph, max_iter=epochs, batch_size=16, learning_rate=0.05, random_state=0)
    trainer.fit(X_train, y_train)
    session = ort.InferenceSession(trainer.get_trained_onnx().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    labels, probabilities, _ = session.run(None, {"X": X_test})
    result = {
        "accuracy_ortflow": float((labels == y_test).mean()),
        "accuracy_sklearn": reference.score(X_test, y_test),
        "probabilities_shape": probabilities.shape,
        "last_loss": trainer.train_losses_[-1],
    }
    for key, value in result.items():
        print(f"{key:>20}: {value}")
    return result


if __name__ == "__main__":
    main()
