"""A mixed table, ortflow against scikit-learn's own fit of the same Pipeline: ``python -m bench.tables``.

The table: ``--rows`` rows (100,000 by default; a quarter held out for the test score), five numeric columns (two with
5% gaps), three categorical columns of 10, 100 and 1,000 levels (text; 5% of their cells the category ``missing``)
and a target linear in the numbers plus an effect per level, with noise. The Pipeline: a ColumnTransformer
(median imputation + standardization of the numbers, one-hot of the categories, unknown levels ignored) and the
model, ``--model sgd`` (SGDRegressor: scikit-learn's per-row SGD, ortflow's mini-batch SGD on the same squared
error) or ``--model mlp`` (MLPRegressor (32,), solver sgd, the same batch size and rate in both).

Measured, wall and CPU seconds (``process_time``: every thread of the process; the figure to read on a shared,
loaded machine), medians over ``--repeats``: scikit-learn's ``Pipeline.fit`` for ``--epochs`` epochs, and
ortflow's path from the same data: the Pipeline fitted for one epoch (the start: preprocessing statistics and
weights), ``to_onnx`` (one input per column), then ``OrtGradientOptimizer`` for ``--epochs`` epochs on the
DataFrame (the preprocessing runs once, in the frozen prefix); the test R² of each. With torch installed, PyTorch
trains the same remaining epochs from the same start on the same preprocessing (the start's ColumnTransformer
output, made dense once: ``torch_transform``), same batches, rate and mean squared error (``torch_fit``), at
the thread count torch has.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np


def make_table(rows: int, seed: int = 0):
    import pandas as pd

    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"x{i}": rng.normal(size=rows) for i in range(5)})
    y = frame.to_numpy() @ np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    for name, levels in (("c10", 10), ("c100", 100), ("c1000", 1000)):
        codes = rng.integers(0, levels, size=rows)
        y += rng.normal(size=levels)[codes]
        values = np.array([f"{name}_{k}" for k in range(levels)], dtype=object)[codes]
        values[rng.random(rows) < 0.05] = "missing"
        frame[name] = values
    for name in ("x1", "x3"):
        frame.loc[rng.random(rows) < 0.05, name] = np.nan
    return frame, y + rng.normal(scale=0.5, size=rows)


def pipeline(model: str, epochs: int, batch_size: int, learning_rate: float):
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import SGDRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    pre = ColumnTransformer([
        ("numbers", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), [f"x{i}" for i in range(5)]),
        ("categories", OneHotEncoder(handle_unknown="ignore"), ["c10", "c100", "c1000"]),
    ])
    if model == "sgd":
        estimator = SGDRegressor(max_iter=epochs, tol=None, learning_rate="constant", eta0=learning_rate,
                                 alpha=0.0, shuffle=False, random_state=0)
    else:
        estimator = MLPRegressor(hidden_layer_sizes=(32,), solver="sgd", batch_size=batch_size, learning_rate_init=learning_rate * 2,
                                 momentum=0.0, max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1,
                                 shuffle=False, alpha=0.0, random_state=0)
    return make_pipeline(pre, estimator)


def _timed(fn):
    """``(value, (wall seconds, CPU seconds of the process, every thread))``."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, (time.perf_counter() - wall, time.process_time() - cpu)


def run(args) -> dict:
    import ortflow
    from sklearn.exceptions import ConvergenceWarning

    frame, y = make_table(args.rows)
    n_train = len(y) - len(y) // 4
    train, test, y_train, y_test = frame[:n_train], frame[n_train:], y[:n_train], y[n_train:]
    results = {"sklearn_fit": [], "start_fit": [], "to_onnx": [], "ortflow_fit": [], "torch_transform": [],
               "torch_fit": []}
    torch_r2 = None
    for _ in range(args.repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            reference, seconds = _timed(lambda: pipeline(args.model, args.epochs, args.batch_size,
                                                         args.learning_rate).fit(train, y_train))
            results["sklearn_fit"].append(seconds)
            start, seconds = _timed(lambda: pipeline(args.model, 1, args.batch_size,
                                                     args.learning_rate).fit(train, y_train))
            results["start_fit"].append(seconds)
        onx, seconds = _timed(lambda: ortflow.to_onnx(start, train[:1]))
        results["to_onnx"].append(seconds)
        # the start's one epoch is counted in start_fit: ortflow trains the remaining epochs
        trainer = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"),
                                               max_iter=args.epochs - 1, batch_size=args.batch_size,
                                               learning_rate=args.learning_rate, shuffle=False)
        _, seconds = _timed(lambda: trainer.fit(train, y_train))
        results["ortflow_fit"].append(seconds)
        torch_run = _torch(start, train, y_train, test, y_test, args)
        if torch_run is not None:
            results["torch_transform"].append(torch_run[0])
            results["torch_fit"].append(torch_run[1])
            torch_r2 = torch_run[2]
    summary = {}
    for clock, index in (("wall", 0), ("cpu", 1)):
        summary.update({f"{k}_{clock}": float(np.median([t[index] for t in v])) for k, v in results.items() if v})
        summary[f"ortflow_total_{clock}"] = float(np.median([
            sum(results[k][r][index] for k in ("start_fit", "to_onnx", "ortflow_fit")) for r in range(args.repeats)]))
    summary["sklearn_test_r2"] = float(reference.score(test, y_test))
    summary["ortflow_test_r2"] = float(trainer.score(test, y_test))
    summary["torch_test_r2"] = torch_r2
    summary["n_features_after_preprocessing"] = int(start[:-1].transform(train[:1]).shape[1])
    summary.update(rows=args.rows, model=args.model, epochs=args.epochs, batch_size=args.batch_size,
                   learning_rate=args.learning_rate, repeats=args.repeats, backend=ortflow.backend())
    return summary


def _torch(start, train, y_train, test, y_test, args):
    """PyTorch from the start's weights on the start's preprocessing: ``((wall, cpu) of the transform, (wall, cpu)
    of the epochs, test R²)``, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from sklearn.metrics import r2_score

    pre, model = start[:-1], start[-1]

    def dense(frame):
        values = pre.transform(frame)
        return torch.from_numpy(np.asarray(values.toarray() if hasattr(values, "toarray") else values,
                                           dtype=np.float32))

    X, transform = _timed(lambda: dense(train))
    y = torch.from_numpy(np.asarray(y_train, dtype=np.float32)).reshape(-1, 1)
    if hasattr(model, "coefs_"):
        layers = []
        for i, (w, b) in enumerate(zip(model.coefs_, model.intercepts_)):
            linear = torch.nn.Linear(*w.shape)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(w.T.astype(np.float32)))
                linear.bias.copy_(torch.from_numpy(b.astype(np.float32)))
            layers += [linear] + ([torch.nn.ReLU()] if i < len(model.coefs_) - 1 else [])
        net = torch.nn.Sequential(*layers)
    else:
        net = torch.nn.Linear(X.shape[1], 1)
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(np.asarray(model.coef_, dtype=np.float32).reshape(1, -1)))
            net.bias.copy_(torch.from_numpy(np.asarray(model.intercept_, dtype=np.float32).reshape(1)))
    optimizer = torch.optim.SGD(net.parameters(), lr=args.learning_rate)
    loss_fn = torch.nn.MSELoss()

    def epochs():
        for _ in range(args.epochs - 1):
            for i in range(0, len(X), args.batch_size):
                optimizer.zero_grad()
                loss_fn(net(X[i:i + args.batch_size]), y[i:i + args.batch_size]).backward()
                optimizer.step()

    _, fit = _timed(epochs)
    with torch.no_grad():
        predicted = net(dense(test)).numpy().ravel()
    return transform, fit, float(r2_score(y_test, predicted))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--model", choices=("sgd", "mlp"), default="mlp")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    summary = run(args)
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
