"""Benchmarks: ortflow against the raw onnxruntime training loop, scikit-learn and PyTorch.

Run ``python -m bench.run [--quick]`` (or ``make bench``); see docs/PERFORMANCE.md.
"""
