"""ortflow's own gradient graphs: reverse-mode differentiation of ONNX graphs into standard ONNX nodes.

``rules.py`` holds one vector-Jacobian product per op (the layers in ``rules_nn.py``, the picks and pads in
``rules_indexing.py``), ``builder.py`` the reverse pass over the graph,
``derivative.py`` the public :func:`onnx_derivative`, ``training.py`` one optimizer step as one graph; the nodes
are written by :class:`ortflow.graph.builder.Emitter`, ortflow's one node writer.
"""

from .builder import Gradients, build_gradients, nodes_without_rule
from .derivative import onnx_derivative
from .rules import NO_GRADIENT, RULES
from .training import training_step

__all__ = ["NO_GRADIENT", "RULES", "Gradients", "build_gradients", "nodes_without_rule", "onnx_derivative",
           "training_step"]
