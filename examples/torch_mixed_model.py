"""A mixed model trained end to end: a torch ``Linear`` layer, an ONNX MLP run by onnxruntime, a torch ``Linear`` head.

The ONNX part is ``ortflow.torch.OnnxModule``: its weights are torch parameters, so one ``torch.optim.AdamW`` and one
LR scheduler train the three layers together; gradients flow through the ONNX graph into the first layer. At the
end the ONNX layer exports its trained graph, which a plain InferenceSession runs. Needs torch (``ortflow[torch]``).

Run: python -m examples.torch_mixed_model
"""

import warnings

import numpy as np
import torch
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ortflow import to_onnx
from ortflow._ort import InferenceSession
from ortflow.torch import OnnxModule


def main(epochs: int = 30, batch_size: int = 64) -> dict:
    X, y = make_regression(2000, n_features=20, n_informative=10, noise=5.0, random_state=1)
    X = torch.tensor(StandardScaler().fit_transform(X), dtype=torch.float32)
    y = torch.tensor(y / y.std(), dtype=torch.float32).reshape(-1, 1)
    # One scikit-learn iteration on 8 random features gives the ONNX block's architecture and a random start.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        block = MLPRegressor(hidden_layer_sizes=(32,), max_iter=1, random_state=0).fit(
            np.random.default_rng(0).standard_normal((64, 8)), np.zeros((64, 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 8),  # torch
        OnnxModule(to_onnx(block)),  # ONNX: 8 -> 32 (relu) -> 4, run by onnxruntime
        torch.nn.Linear(4, 1),  # torch
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(X), batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(X[start : start + batch_size]), y[start : start + batch_size])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(X[start : start + batch_size])
        scheduler.step()
        losses.append(total / len(X))
    onnx_layer = model[1]
    hidden = model[0](X[:5]).detach()
    session = InferenceSession(onnx_layer.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    exported = session.run(None, {"X": hidden.numpy()})[0]
    result = {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "onnx_parameters": list(onnx_layer.parameter_names_.values()),
        "exported_matches": bool(np.allclose(exported, onnx_layer(hidden).detach().numpy(), atol=1e-6)),
        "first_layer_got_gradient": bool(model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0),
    }
    for key, value in result.items():
        print(f"{key:>20}: {value}")
    return result


if __name__ == "__main__":
    main()
