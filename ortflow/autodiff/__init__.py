"""ortflow's own gradient graphs: reverse-mode differentiation of ONNX graphs into standard ONNX nodes.

``rules.py`` holds one vector-Jacobian product per op, ``builder.py`` the reverse pass over the graph,
``emitter.py`` node writing and broadcasting, ``derivative.py`` the public :func:`onnx_derivative`.
"""

from .builder import Gradients, build_gradients
from .derivative import onnx_derivative
from .rules import NO_GRADIENT, RULES

__all__ = ["NO_GRADIENT", "RULES", "Gradients", "build_gradients", "onnx_derivative"]
