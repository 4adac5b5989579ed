"""Graph tooling: reading, checking and editing ONNX graphs (`editing`) and writing nodes (`builder`)."""
