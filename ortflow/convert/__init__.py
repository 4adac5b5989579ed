"""scikit-learn models to trainable ONNX graphs: the converters (`sklearn`), dates in tables (`tables`) and `ai.onnx.ml` ops rewritten as trainable ones (`ml_op_rewrites`)."""
