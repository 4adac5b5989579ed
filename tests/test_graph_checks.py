"""Graphs that are broken in the ways a probe found (issue 17): each is refused by ortflow's loader with an
UnsupportedModelError naming the problem, before any session, gradient graph or buffer is built."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from sklearn.linear_model import LinearRegression

from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, UnsupportedModelError, add_loss_output
from ortflow import to_onnx
from ortflow.graph.editing import check_loadable, load_model


@pytest.fixture(scope="module")
def linear(regression_data):
    return to_onnx(LinearRegression().fit(*regression_data))


def _copy(model):
    new = onnx.ModelProto()
    new.CopyFrom(model)
    return new


def test_empty_or_corrupted_files_are_named(tmp_path, linear):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(UnsupportedModelError, match="empty.onnx is empty, not an ONNX model"):
        load_model(empty)
    data = bytearray(linear.SerializeToString())
    broken = []
    for position in range(0, len(data), max(1, len(data) // 40)):  # a flipped byte at 40 places
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        path = tmp_path / f"flipped-{position}.onnx"
        path.write_bytes(bytes(flipped))
        try:
            check_loadable(load_model(path))
        except UnsupportedModelError as exc:
            assert path.name in str(exc) or "initializer" in str(exc) or "opset" in str(exc) or "node" in str(
                exc) or "graph" in str(exc) or "IR version" in str(exc), exc
            broken.append(position)
        # a flip that still parses into a consistent graph (a changed weight value) cannot be told apart
    assert len(broken) >= 10
    with pytest.raises(UnsupportedModelError, match="truncated or corrupted"):
        load_model(bytes(data[: len(data) // 2]))
    with pytest.raises(UnsupportedModelError, match="not a readable ONNX model"):
        load_model(b"\xff" * 64)


def test_opsets_missing_or_too_new_are_named(regression_data, linear):
    X, y = regression_data
    no_opset = _copy(linear)
    del no_opset.opset_import[:]
    with pytest.raises(UnsupportedModelError, match=r"nodes of domains \[''\] but no opset_import"):
        OrtGradientForwardBackwardOptimizer(no_opset, max_iter=1).fit(X, y)
    full, fwbw = add_loss_output(linear), _copy(linear)
    for graph in (full, fwbw):
        graph.opset_import.append(helper.make_opsetid("ai.onnx.ml", 99))
    for trainer in (OrtGradientOptimizer(full, max_iter=1), OrtGradientForwardBackwardOptimizer(fwbw, max_iter=1)):
        with pytest.raises(UnsupportedModelError, match="opset 99 of domain 'ai.onnx.ml'.* at most 5"):
            trainer.fit(X, y)


def test_initializer_declaring_more_than_it_holds_is_refused_before_allocation(regression_data, linear):
    X, y = regression_data
    graph = add_loss_output(linear)
    huge = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "huge")
    del huge.dims[:]
    huge.dims.extend([1 << 33])  # 32 GiB of float32 declared, 16 bytes held
    graph.graph.initializer.append(huge)
    with pytest.raises(UnsupportedModelError, match=r"'huge' declares shape 8589934592 of FLOAT \(34359738368 bytes\) "
                                                    r"but holds 16 bytes"):
        OrtGradientOptimizer(graph, max_iter=1).fit(X, y)
    typed = _copy(linear)
    tensor = typed.graph.initializer.add()
    tensor.name, tensor.data_type = "typed", onnx.TensorProto.FLOAT
    tensor.dims.extend([1000, 1000])
    tensor.float_data.extend([1.0, 2.0])
    with pytest.raises(UnsupportedModelError, match=r"'typed' declares shape 1000x1000 of FLOAT \(1000000 values\)"):
        check_loadable(typed)


def test_node_reading_an_undefined_name_is_named(linear):
    model = _copy(linear)
    model.graph.node[0].input[0] = "nowhere"
    with pytest.raises(UnsupportedModelError, match=r"reads \['nowhere'\], which no graph input"):
        check_loadable(model)


def test_external_data_shorter_than_declared_is_refused(tmp_path, linear):
    from onnx.external_data_helper import convert_model_to_external_data

    model = _copy(linear)
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, str(tmp_path / "model.onnx"))
    assert load_model(tmp_path / "model.onnx").graph.initializer  # intact: loads
    (tmp_path / "weights.bin").write_bytes((tmp_path / "weights.bin").read_bytes()[:8])
    with pytest.raises(UnsupportedModelError, match="at 'weights.bin'.*that file holds 8 bytes"):
        load_model(tmp_path / "model.onnx")
