"""Two small reference networks built in PyTorch (no downloaded weights, fixed seed) and exported to ONNX the way
a user would (TorchScript exporter, opset 17, batch axis dynamic): a LeNet-style CNN for 8x8 digits and a
two-layer transformer encoder over int64 tokens. Used to check ortflow's gradients against torch autograd.

Needs torch: import it from a test after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import io

import onnx
import torch
from torch import nn

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
