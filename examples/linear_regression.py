"""Full training of a linear regression from a poor start, compared with scikit-learn's exact solution.

Run: python -m examples.linear_regression
"""

import numpy as np
from sklearn.datasets import make_regression
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import train_test_split

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx


def main(epochs: int = 50) -> dict:
    X, y = make_regression(2000, n_features=10, noise=2.0, bias=2.0, random_state=0)
    X, y = X.astype(np.float32), (y / 100).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

    reference = LinearRegression().fit(X_train, y_train)
    # Start from a deliberately poor model: fitted on 20 rows of zeros.
    start = LinearRegression().fit(X_train[:20], np.zeros(20))
    graph = add_loss_output(to_onnx(start), "squared_error")

    trainer = OrtGradientOptimizer(graph, max_iter=epochs, batch_size=20, learning_rate=0.02, random_state=0)
    trainer.fit(X_train, y_train)
    coef = trainer.get_state()["coef"].ravel()
    result = {
        "max_coef_gap": float(np.abs(coef - reference.coef_).max()),
        "r2_ortflow": trainer.score(X_test, y_test),
        "r2_sklearn": reference.score(X_test, y_test),
        "first_loss": trainer.train_losses_[0],
        "last_loss": trainer.train_losses_[-1],
    }
    for key, value in result.items():
        print(f"{key:>14}: {value:.6g}")
    return result


if __name__ == "__main__":
    main()
