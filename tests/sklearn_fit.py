"""A scikit-learn fit without its ConvergenceWarning: the tests' short fits stop early on purpose (a start for ONNX
training, or graphs compared with whatever scikit-learn reached)."""

import warnings

from sklearn.exceptions import ConvergenceWarning


def quiet_fit(model, X, y):
    """``model.fit(X, y)``, its ConvergenceWarning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)
