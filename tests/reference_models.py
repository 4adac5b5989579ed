"""Two small reference networks built in PyTorch (no downloaded weights, fixed seed) and exported to ONNX the way
a user would (TorchScript exporter, opset 17, batch axis dynamic): a LeNet-style CNN for 8x8 digits and a
two-layer transformer encoder over int64 tokens. Used to check ortflow's gradients and training against torch's.

Needs torch: import it from a test after ``pytest.importorskip("torch")``. ``python -m tests.reference_models
--write`` writes the exported graphs and torch's training runs into tests/data/reference (see
tests/reference_data.py, which reads them without torch); tests/test_reference_training.py checks that they are
current.
"""

from __future__ import annotations

import argparse
import io
import sys
import time

import numpy as np
import onnx
import torch
from torch import nn

try:
    from . import reference_data  # python -m tests.reference_models
except ImportError:  # imported by a test: tests/ is on sys.path
    import reference_data

VOCAB, D_MODEL, SEQ = 32, 16, 12


class LeNet(nn.Module):
    """1x8x8 images -> 10 logits: conv + batch norm (eval) + relu + max pool, conv + relu, global average pool,
    linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class TinyTransformer(nn.Module):
    """(N, 12) int64 tokens -> 2 logits: embedding, two encoder layers (gelu), mean over tokens, linear."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=2, dim_feedforward=32, activation="gelu",
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, 2)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def lenet(seed: int = 0) -> LeNet:
    torch.manual_seed(seed)
    model = LeNet()
    with torch.no_grad():  # running statistics away from the defaults (0, 1), as after some training
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
        model.bn1.weight.uniform_(0.5, 1.5)
        model.bn1.bias.uniform_(-0.2, 0.2)
    return model.eval()


def transformer(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    model = TinyTransformer()
    _perturb(model)
    return model.eval()


def _perturb(model: nn.Module, scale: float = 0.1) -> None:
    """Every parameter moved by its own noise, as after some training: the freshly cloned encoder layers share their
    initial values (and the layer norms' ones and zeros equal each other), which the exporter would fold into one
    initializer named after the first parameter holding it."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn_like(parameter))


def export(model: nn.Module, example: torch.Tensor, input_name: str) -> onnx.ModelProto:
    """``model`` exported with the TorchScript exporter at opset 17, batch axis dynamic, constants not folded."""
    buffer = io.BytesIO()
    torch.onnx.export(model, (example,), buffer, dynamo=False, opset_version=17, do_constant_folding=False,
                      input_names=[input_name], output_names=["logits"],
                      dynamic_axes={input_name: {0: "N"}, "logits": {0: "N"}})
    return onnx.load_from_string(buffer.getvalue())


BUILDERS = {"lenet": lenet, "transformer": transformer}


def torch_training(model: nn.Module, inputs: np.ndarray, labels: np.ndarray, learning_rate: float, batch_size: int,
                   epochs: int, times: list | None = None) -> np.ndarray:
    """torch's own loop: per batch (in order) ``zero_grad``, mean cross-entropy, ``backward``,
    ``torch.optim.SGD.step`` (no momentum) on the parameters that require a gradient; the row-weighted mean of the
    batch losses of every epoch. The model stays in eval mode (batch norm on its running statistics, as exported).
    ``times`` (a list) receives the wall and CPU seconds (``time.process_time``) of every epoch, in pairs."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    x, y = torch.from_numpy(inputs), torch.from_numpy(labels)
    losses = []
    for _ in range(epochs):
        begin = time.perf_counter(), time.process_time()
        total = 0.0
        for start in range(0, len(x), batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x[start: start + batch_size]), y[start: start + batch_size])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y[start: start + batch_size])
        if times is not None:
            times.append((time.perf_counter() - begin[0], time.process_time() - begin[1]))
        losses.append(total / len(x))
    return np.asarray(losses)


def reference_run(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A fresh export of network ``name`` and the arrays of its ``.npz``: data, settings, torch's loss per epoch
    (one torch thread: the run does not depend on the machine's core count)."""
    stored, labels = reference_data.digits() if name == "lenet" else reference_data.tokens(rows=512, vocab=VOCAB,
                                                                                           seq=SEQ)
    inputs = reference_data.as_inputs(name, stored)
    settings = reference_data.SETTINGS[name]
    model = BUILDERS[name]()
    exported = export(model, torch.from_numpy(inputs[:2]), reference_data.INPUT_NAME[name])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = torch_training(model, inputs, labels.astype(np.int64), settings["learning_rate"],
                                settings["batch_size"], settings["epochs"])
    finally:
        torch.set_num_threads(threads)
    arrays = {
        "inputs": stored,
        "labels": labels,
        "n_classes": np.int64(int(labels.max()) + 1),
        "torch_losses": losses,
        "parameters": np.asarray([n for n, _ in BUILDERS[name]().named_parameters()]),
        **{k: np.asarray(v) for k, v in settings.items()},
    }
    return exported, arrays


def write(folder=reference_data.FOLDER) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in reference_data.NAMES:
        exported, arrays = reference_run(name)
        onnx.save(exported, folder / f"{name}.onnx")
        np.savez_compressed(folder / f"{name}.npz", **arrays)
        written += [str(folder / f"{name}.onnx"), str(folder / f"{name}.npz")]
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reference_models", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write tests/data/reference/*.onnx and *.npz")
    args = parser.parse_args(argv)
    if not args.write:
        parser.print_help()
        return 2
    for path in write():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
