"""Forward-backward training of an MLPRegressor graph with Nesterov momentum and an elastic-net penalty.

The same architecture is trained twice, with and without the penalty: the penalty shrinks the weights.
Run: python -m examples.nesterov_penalty
"""

import warnings

import numpy as np
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ortflow import to_onnx
from ortflow import ElasticLearningPenalty, LearningRateSGDNesterov, OrtGradientForwardBackwardOptimizer


def main(epochs: int = 15) -> dict:
    X, y = make_regression(600, n_features=10, n_informative=6, noise=2.0, random_state=2)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    y = (y / y.std()).astype(np.float32)
    with warnings.catch_warnings():  # one iteration on purpose: it only gives the architecture
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = to_onnx(MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y))
    rate = LearningRateSGDNesterov(eta0=0.01, learning_rate="invscaling", power_t=0.25, momentum=0.9)
    trainers = {}
    for name, penalty in (("none", None), ("elastic", ElasticLearningPenalty(l1=1e-3, l2=1e-2))):
        trainers[name] = OrtGradientForwardBackwardOptimizer(
            start, max_iter=epochs, batch_size=16, learning_rate=rate, learning_penalty=penalty, random_state=0
        ).fit(X, y)
    norms = {name: float(sum(np.abs(w).sum() for w in t.get_state().values())) for name, t in trainers.items()}
    penalized = trainers["elastic"]
    result = {
        "first_loss": penalized.train_losses_[0],
        "last_loss": penalized.train_losses_[-1],
        "r2_without_penalty": trainers["none"].score(X, y),
        "r2_with_penalty": penalized.score(X, y),
        "l1_norm_without_penalty": norms["none"],
        "l1_norm_with_penalty": norms["elastic"],
    }
    for key, value in result.items():
        print(f"{key:>24}: {value}")
    return result


if __name__ == "__main__":
    main()
