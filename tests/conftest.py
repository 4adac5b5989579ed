"""Shared fixtures: small data sets (float32), built once per session."""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def regression_data():
    from sklearn.datasets import make_regression

    X, y = make_regression(400, n_features=8, noise=1.0, bias=2.0, random_state=0)
    return X.astype(np.float32), (y / 50).astype(np.float32)


@pytest.fixture(scope="session")
def classification_data():
    from sklearn.datasets import make_classification

    X, y = make_classification(400, n_features=8, n_informative=5, random_state=0)
    return X.astype(np.float32), y.astype(np.int64)
