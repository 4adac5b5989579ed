"""What the stages share about models: scikit-learn estimators and graph surgery (``estimators``), predictions of
an ONNX graph (``predictions``), test metrics (``metrics``) and figures (``plots``)."""
