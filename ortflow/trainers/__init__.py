"""The scikit-learn estimators that train a graph (full, forward-backward, torch), their shared loop, parameters, callbacks, checkpoints and predictions."""
