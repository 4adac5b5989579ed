"""Forward-backward training of an MLPClassifier graph with the binary log loss on its raw score.

Gradients flow through ``raw_score`` only; the exported graph still predicts labels and probabilities, read here by
a plain onnxruntime InferenceSession. Run: python -m examples.binary_classification_fwbw
"""

import warnings

import numpy as np
import onnxruntime as ort
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from ortflow import to_onnx
from ortflow import LearningRateSGDNesterov, NegLogLearningLoss, OrtGradientForwardBackwardOptimizer


def main(epochs: int = 20) -> dict:
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, stratify=y, random_state=0)
    schedule = dict(hidden_layer_sizes=(16,), solver="sgd", learning_rate="invscaling", learning_rate_init=0.02,
                    momentum=0.9, nesterovs_momentum=True, batch_size=16, alpha=0.0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference = MLPClassifier(max_iter=epochs, **schedule).fit(X_train, y_train)
        start = MLPClassifier(max_iter=1, **schedule).fit(X_train[:40], y_train[:40])  # the architecture only
    trainer = OrtGradientForwardBackwardOptimizer(
        to_onnx(start), max_iter=epochs, batch_size=16, learning_loss=NegLogLearningLoss(),
        learning_rate=LearningRateSGDNesterov(eta0=0.02, learning_rate="invscaling", momentum=0.9),
        random_state=0,
    ).fit(X_train, y_train)
    session = ort.InferenceSession(trainer.get_trained_onnx().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    labels, probabilities, _ = session.run(None, {"X": X_test})
    result = {
        "first_loss": trainer.train_losses_[0],
        "last_loss": trainer.train_losses_[-1],
        "accuracy_ortflow": float((labels == y_test).mean()),
        "accuracy_sklearn": reference.score(X_test, y_test),
        "probabilities_shape": probabilities.shape,
    }
    for key, value in result.items():
        print(f"{key:>20}: {value}")
    return result


if __name__ == "__main__":
    main()
