"""The benchmark cases: data, model, optimizer settings and the initial weights every engine starts from.

All engines of a case train the same model on the same float32 rows, in the same order (no shuffling), with the
same batch size, learning rate and loss, starting from the same weights: a scikit-learn MLP fitted for one epoch
(on at most 1,000 rows) gives them; ``ortflow.to_onnx`` turns it into the ONNX graph, PyTorch copies the arrays.

Losses are reported on one scale: MSE = mean over rows of (prediction - y)**2 for regression (ortflow's
``squared_error``, torch's ``MSELoss``), mean log loss on the raw score for classification (binary: sigmoid;
k classes: softmax cross-entropy, torch's ``CrossEntropyLoss``). scikit-learn's
MLP minimizes *half* the squared error, so its learning rate is doubled (same updates) and its reported loss is
doubled (same scale).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import asdict, dataclass, field, replace

import numpy as np

#: Engines and what they are. ``raw`` is the floor: the on-device training loop written by hand.
ENGINES = {
    "raw": "onnxruntime on-device training API loop written by hand (Module/Optimizer, no ortflow trainer code)",
    "ortflow-full": "ortflow.OrtGradientOptimizer (full training: loss, gradient and update inside onnxruntime)",
    "ortflow-fwbw": "ortflow.OrtGradientForwardBackwardOptimizer (TrainingAgent forward/backward + update graphs)",
    "sklearn": "scikit-learn MLPRegressor/MLPClassifier, solver='sgd', one partial_fit per epoch",
    "sklearn-sgd": "scikit-learn SGDRegressor (per-row SGD: batch size 1, a different algorithm; time only)",
    "torch": "PyTorch CPU, nn.Sequential + torch.optim.SGD, same thread count",
    "ortflow-torch": "the ONNX graph as one ortflow.torch.OnnxModule layer in the torch loop (torch.optim.SGD)",
}


@dataclass
class Case:
    """One benchmark configuration."""

    key: str
    title: str
    task: str = "regression"  # or "classification"
    dataset: str = "generated"  # make_regression / make_classification, or "digits" (sklearn's bundled 8x8 digits)
    n_rows: int = 1000  # rows generated; with ``split`` a quarter goes to the (unused) test set
    split: bool = True
    n_features: int = 100
    hidden: tuple = (50, 10)
    batch_size: int = 15
    epochs: int = 100
    learning_rate: float = 0.01
    momentum: float = 0.0  # > 0: Nesterov momentum
    engines: tuple = ("raw", "ortflow-full", "ortflow-fwbw", "sklearn", "torch")
    reference: str = "raw"  # ratios are computed against this engine
    loss_engines: tuple | None = None  # engines whose final loss must agree (default: all but 'sklearn-sgd')
    memory: bool = False  # measure peak RSS in subprocesses
    max_repeats: int | None = None  # cap on the interleaved repeats (the biggest size)
    group: str = ""  # 'scaling' for the rows sweep of case D
    notes: str = ""
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def n_train(self) -> int:
        return self.n_rows - self.n_rows // 4 if self.split else self.n_rows

    @property
    def checked_engines(self) -> tuple:
        if self.loss_engines is not None:
            return self.loss_engines
        return tuple(e for e in self.engines if e != "sklearn-sgd")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        d["engines"] = list(self.engines)
        d["n_train"] = self.n_train
        return d


def default_cases(quick: bool = False, tiny: bool = False) -> list[Case]:
    """The suite. ``quick`` shortens the big sizes, ``tiny`` shrinks everything (smoke test)."""
    epochs = 100
    cases = [
        Case("A", "MLP (50,10) regression, SGD", epochs=epochs,
             engines=("raw", "ortflow-full", "ortflow-fwbw", "sklearn", "torch", "ortflow-torch")),
        Case(
            "B",
            "Linear regression, SGD",
            hidden=(),
            epochs=epochs,
            engines=("raw", "ortflow-full", "ortflow-fwbw", "sklearn", "sklearn-sgd", "torch"),
            notes="scikit-learn's minibatch engine is MLPRegressor(hidden_layer_sizes=()), a linear model trained by "
            "the same minibatch SGD; SGDRegressor (per-row updates) is timed for reference only.",
        ),
        Case(
            "C",
            "MLP (50,10) binary classification, log loss, SGD + Nesterov momentum",
            task="classification",
            momentum=0.9,
            epochs=epochs,
            engines=("ortflow-fwbw", "sklearn", "torch"),
            reference="ortflow-fwbw",
            notes="The on-device training API has no momentum SGD (only SGD and AdamW), so neither the raw loop nor "
            "ortflow's full training can run this case: fwbw, scikit-learn and PyTorch are compared.",
        ),
        Case(
            "E",
            "MLP (64,) 10-class classification (digits), softmax log loss, SGD",
            task="classification",
            dataset="digits",
            n_rows=1797,
            n_features=64,
            hidden=(64,),
            epochs=epochs,
            notes="scikit-learn's bundled 8x8 digits (pixels / 16), 25% held out; the model ends in 10 raw scores and "
            "every engine minimizes the mean softmax cross-entropy (the raw loop feeds the one-hot rows the loss "
            "graph takes, PyTorch's CrossEntropyLoss the labels).",
        ),
    ]
    # D: per-epoch time against rows (batch 15, the model of A); fewer epochs at big sizes.
    rows_epochs = [(1_000, 20), (10_000, 5), (100_000, 2), (1_000_000, 1)]
    if quick:
        rows_epochs = [(1_000, 10), (10_000, 3), (100_000, 1)]
    for rows, ep in rows_epochs:
        cases.append(
            Case(
                f"D-{_short(rows)}",
                f"MLP (50,10) regression, {rows:,} rows",
                n_rows=rows,
                split=False,
                epochs=ep,
                memory=True,
                group="scaling",
                max_repeats=3 if rows >= 1_000_000 else None,
                notes="1,000,000 rows: 1 epoch and 3 repeats (not 5) to keep the suite under 15 minutes on 2 cores."
                if rows >= 1_000_000 else "",
            )
        )
    cases.append(
        Case(
            "D-wide",
            "Wide MLP (256,256) regression, batch 256",
            n_rows=50_000 if not quick else 20_000,
            split=False,
            hidden=(256, 256),
            batch_size=256,
            epochs=3 if not quick else 2,
            learning_rate=0.01,
            memory=True,
            engines=("raw", "ortflow-full", "ortflow-fwbw", "sklearn", "torch", "ortflow-torch"),
        )
    )
    if tiny:
        small = []
        for c in cases:
            if c.group == "scaling":
                rows = {1_000: 200, 10_000: 400}.get(c.n_rows)
                if rows is None:
                    continue
                c = replace(c, n_rows=rows, key=f"D-{rows}", title=f"MLP regression, {rows:,} rows")
            elif c.key == "D-wide":
                c = replace(c, n_rows=300, hidden=(16, 16), batch_size=32, memory=False, title="Wide MLP (tiny)")
            else:
                c = replace(c, n_rows=200)
            features = 10 if c.dataset == "generated" else c.n_features  # digits have their 64 pixels
            small.append(replace(c, epochs=min(c.epochs, 3), n_features=features))
        cases = small
    return cases


def _short(rows: int) -> str:
    for value, suffix in ((1_000_000, "1e6"), (100_000, "1e5"), (10_000, "1e4"), (1_000, "1e3")):
        if rows == value:
            return suffix
    return str(rows)


@dataclass
class CaseData:
    """Training rows (float32, C-contiguous) and the initial scikit-learn model."""

    X: np.ndarray
    y: np.ndarray  # (N, 1) float32: targets, or class labels
    init_model: object  # fitted scikit-learn MLP, one epoch

    @property
    def loss_targets(self) -> np.ndarray:
        """What the loss graph's label input takes: ``y``, or one-hot rows (float32) for more than two classes."""
        classes = getattr(self.init_model, "classes_", None)
        if classes is None or len(classes) <= 2:
            return self.y
        return np.ascontiguousarray(self.y.ravel()[:, None] == classes[None, :], dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return int(self.X.nbytes + self.y.nbytes)


def make_data(case: Case) -> CaseData:
    """Generate the case's rows and initial model (deterministic for a given case)."""
    from sklearn.datasets import make_classification, make_regression
    from sklearn.model_selection import train_test_split

    if case.dataset == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X, y = X[: case.n_rows] / 16.0, y[: case.n_rows]  # pixels 0..16 brought to 0..1
    elif case.task == "regression":
        X, y = make_regression(case.n_rows, n_features=case.n_features, bias=2.0, random_state=case.seed)
    else:
        X, y = make_classification(
            case.n_rows, n_features=case.n_features, n_informative=min(10, case.n_features // 2), random_state=case.seed
        )
    if case.split:
        X, _, y, _ = train_test_split(X, y, test_size=case.n_rows // 4, random_state=case.seed)
    X = np.ascontiguousarray(X, dtype=np.float32)
    if case.task == "regression":
        # make_regression's targets have a std of ~100: standardize them, or SGD at lr=0.01 diverges.
        y = (y - y.mean()) / y.std()
    y = np.ascontiguousarray(y.reshape(-1, 1), dtype=np.float32)
    return CaseData(X, y, initial_model(case, X[:1000], y[:1000]))


def initial_model(case: Case, X: np.ndarray, y: np.ndarray):
    """scikit-learn MLP with the case's settings, fitted one epoch: its weights are every engine's start."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    cls = MLPRegressor if case.task == "regression" else MLPClassifier
    model = cls(**sklearn_params(case), max_iter=1, random_state=case.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y.ravel() if case.task == "regression" else y.ravel().astype(np.int64))
    return model


def sklearn_params(case: Case) -> dict:
    """MLP parameters giving the same updates as the other engines (see the module docstring)."""
    lr = case.learning_rate * (2.0 if case.task == "regression" else 1.0)
    return dict(
        hidden_layer_sizes=tuple(case.hidden),
        activation="relu",
        solver="sgd",
        alpha=0.0,
        batch_size=case.batch_size,
        learning_rate="constant",
        learning_rate_init=lr,
        momentum=case.momentum,
        nesterovs_momentum=case.momentum > 0,
        shuffle=False,
        early_stopping=False,
        tol=0.0,
        n_iter_no_change=10**9,
    )


def fresh_sklearn(data: CaseData):
    """A copy of the initial model with a fresh optimizer (zero velocities)."""
    model = copy.deepcopy(data.init_model)
    for attr in ("_optimizer",):
        if hasattr(model, attr):
            delattr(model, attr)
    return model


def initial_layers(data: CaseData) -> list[tuple[np.ndarray, np.ndarray]]:
    """(coef (in, out), intercept (out,)) float32 per layer."""
    m = data.init_model
    return [(np.asarray(c, dtype=np.float32), np.asarray(b, dtype=np.float32)) for c, b in zip(m.coefs_, m.intercepts_)]
