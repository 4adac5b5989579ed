"""``model=onnx``: the user's own ONNX graph (``model.path``) as the graph training begins from.

No scikit-learn model is fitted: ``convert`` loads the file (:func:`load_graph`, through ``ortflow.graph.editing.load_model``,
which refuses external data outside the file's folder), checks it against the data (:func:`graph_problems`: one
input whose element type and shape fit the split's arrays, the output to train, every node between the trained
weights and that output with a gradient rule of ortflow) and gives it the outputs the pipelines' stages read
(:func:`pipeline_graph`):

- a classifier's logits (``(N, k)``, or ``(N, 1)`` for two classes) become ``raw_score`` through an Identity, followed
  by ortflow's own classifier head (:func:`ortflow.convert.sklearn.classifier_head`: softmax (or sigmoid) probabilities
  ``output_probability``, ``output_label`` looked up in the initializer ``classes``, the data's labels), exactly
  the outputs of a graph ``ortflow.to_onnx`` writes for a scikit-learn classifier;
- a regressor's prediction becomes ``variable`` (what the deploy graph rescales to the target's units).

The chain runs the same checks before any run is created (:mod:`pipelines.orchestration.precheck`), so a graph
with ops that have no gradient rule is refused naming every such node at once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from omegaconf import DictConfig, OmegaConf
from onnx import TensorProto, helper

from ..base.schema import ConfigError

#: the element type a split's array feeds (float32 images or features, int64 tokens)
_ELEMENT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
#: what the regression path of the stages reads (pipelines.stages.evaluate.deploy_graph)
REGRESSION_OUTPUT = "variable"


def graph_path(model: DictConfig) -> Path:
    """``model.path``, relative to the directory the command starts from."""
    from ..base.paths import user_path

    if OmegaConf.is_missing(model, "path") or not model.path:
        raise ConfigError("model=onnx needs model.path: the .onnx file of the graph to train")
    return user_path(str(model.path))


def load_graph(model: DictConfig) -> onnx.ModelProto:
    """The graph at ``model.path``; a :class:`ConfigError` naming the key when it is missing or unreadable."""
    from ortflow.graph.editing import load_model

    path = graph_path(model)
    try:
        return load_model(path)
    except (OSError, ValueError) as exc:  # FileNotFoundError, UnsupportedModelError, UnsafePathError
        raise ConfigError(f"model.path={str(model.path)!r}: {str(exc).splitlines()[0]}") from None


def trained_output(graph: onnx.ModelProto, output: str | None) -> tuple[str | None, list[str]]:
    """The graph output to train (``model.output``, else the only one) and the problems found."""
    names = [o.name for o in graph.graph.output]
    if output:
        if output in names:
            return output, []
        return None, [f"model.output={output!r} is not an output of the graph (its outputs: {names})"]
    if len(names) == 1:
        return names[0], []
    return None, [f"the graph has {len(names)} outputs {names}: name the logits (or the prediction) to train "
                  "with model.output=<name>"]


def graph_problems(graph: onnx.ModelProto, X: np.ndarray, task: str, n_classes: int, output: str | None,
                   weights_to_train=None, gradients: str | None = None) -> list[str]:
    """Every reason ``graph`` cannot be trained on ``X`` (the split's training array) for ``task``, one line each:
    its input (one, of the data's element type and shape), its output (float32, rank 2, ``n_classes`` columns, or
    one for two classes or a regression) and the nodes between the trained weights and that output without a
    gradient rule (all of them; not checked with ``trainer.gradients=onnxruntime``, which builds the gradients)."""
    from ortflow.graph.editing import elem_type, shape_of

    problems = []
    inputs = [i for i in graph.graph.input if i.name not in {init.name for init in graph.graph.initializer}]
    if len(inputs) != 1:
        problems.append(f"the graph has {len(inputs)} inputs {[i.name for i in inputs]}: model=onnx trains a graph "
                        "of one input (the data's array)")
    else:
        spec = inputs[0]
        expected = _ELEMENT.get(np.asarray(X).dtype)
        if spec.type.tensor_type.elem_type != expected:
            problems.append(f"the graph's input {spec.name!r} is {TensorProto.DataType.Name(spec.type.tensor_type.elem_type)} "
                            f"but the data are {np.asarray(X).dtype} "
                            f"({TensorProto.DataType.Name(expected) if expected else 'no ONNX type'})")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in spec.type.tensor_type.shape.dim]
        want = list(np.asarray(X).shape[1:])
        if len(dims) != len(want) + 1 or any(d is not None and d != w for d, w in zip(dims[1:], want)):
            problems.append(f"the graph's input {spec.name!r} has shape {['N' if d is None else d for d in dims]} "
                            f"but the data's rows have shape {want} (batch first: [N, {', '.join(map(str, want))}])")
    name, output_problems = trained_output(graph, output)
    problems += output_problems
    if name is None:
        return problems
    if elem_type(graph, name) != TensorProto.FLOAT:
        problems.append(f"the graph's output {name!r} is not float32: only float32 outputs can be trained")
    shape = shape_of(graph, name)
    width = shape[1] if len(shape) == 2 else None
    if task == "classification":
        if len(shape) != 2 or width not in (n_classes, 1 if n_classes == 2 else n_classes):
            problems.append(f"the graph's output {name!r} has shape {shape}: a classifier of the data's {n_classes} "
                            f"classes outputs its logits as [N, {n_classes}]"
                            + (" (or [N, 1] for two classes)" if n_classes == 2 else ""))
    elif len(shape) not in (1, 2) or (len(shape) == 2 and width != 1):
        problems.append(f"the graph's output {name!r} has shape {shape}: a regressor outputs [N] or [N, 1]")
    if str(gradients or "auto") != "onnxruntime":
        missing = nodes_without_rule(graph, name, weights_to_train)
        if missing:
            problems.append(f"{len(missing)} nodes between the trained weights and {name!r} have no gradient rule in "
                            f"ortflow: {', '.join(missing)} (replace those ops, freeze the layers before them with "
                            "trainer.weights_to_train, or trainer.gradients=onnxruntime on the training build)")
    return problems


def nodes_without_rule(graph: onnx.ModelProto, output: str, weights_to_train=None) -> list[str]:
    """The nodes between the weights training moves and ``output`` that have no gradient rule, in graph order."""
    from ortflow.autodiff import nodes_without_rule as without_rule
    from ortflow.graph.editing import batch_norm_statistics, trainable_initializers
    from ortflow.runtime.validation import check_weights_to_train

    if weights_to_train:
        try:
            weights = check_weights_to_train(graph, list(weights_to_train))
        except ValueError:  # named by the precheck of trainer.weights_to_train
            return []
    else:
        statistics = batch_norm_statistics(graph)
        weights = [w for w in trainable_initializers(graph) if w not in statistics]
    return without_rule(graph, weights, output) if weights else []


def check_graph(cfg: DictConfig, X: np.ndarray, n_classes: int) -> onnx.ModelProto:
    """The graph of ``model.path`` when it can train on ``X``; one :class:`ConfigError` listing every problem."""
    graph = load_graph(cfg.model)
    problems = graph_problems(graph, X, str(cfg.data.task), n_classes, cfg.model.get("output"),
                              cfg.trainer.get("weights_to_train"), cfg.trainer.get("gradients"))
    if problems:
        raise ConfigError.of([f"model.path={str(cfg.model.path)!r}: {p}" for p in problems])
    return graph


def pipeline_graph(graph: onnx.ModelProto, task: str, classes: np.ndarray, output: str | None) -> onnx.ModelProto:
    """A copy of ``graph`` with the outputs of a graph ``ortflow.to_onnx`` writes: ``output_label``,
    ``output_probability`` and ``raw_score`` (the logits, trained) for a classifier, ``variable`` for a regressor."""
    from ortflow.convert.sklearn import RAW_SCORE_OUTPUT, classifier_head
    from ortflow.graph.editing import all_names, shape_of

    name, problems = trained_output(graph, output)
    if problems:
        raise ConfigError.of(problems)
    model = onnx.ModelProto()
    model.CopyFrom(graph)
    target = RAW_SCORE_OUTPUT if task == "classification" else REGRESSION_OUTPUT
    nodes, inits, outputs = [], [], []
    if task == "classification":
        shape = shape_of(graph, name)
        nodes, inits, outputs = classifier_head(np.asarray(classes), score_columns=shape[1])
    added = {t for n in nodes for t in (*n.output, n.name)} | {i.name for i in inits} | {target}
    taken = (all_names(graph) | {n.name for n in graph.graph.node}) & added - {name}
    if taken:
        raise ConfigError(f"the graph already uses the names {sorted(taken)} that model=onnx gives its outputs: "
                          "rename them")
    if name != target:
        nodes.insert(0, helper.make_node("Identity", [name], [target], name=f"model_onnx_{target}"))
    if not outputs:  # a regressor: its prediction under the name the stages read
        value = next(o for o in graph.graph.output if o.name == name)
        renamed = onnx.ValueInfoProto()
        renamed.CopyFrom(value)
        renamed.name = target
        outputs = [renamed]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    onnx.checker.check_model(model)
    return model
