"""The losses, penalties and optimizers of the pipelines are built from their registry classes with the settings
those classes take, taken from the config by name (issue 37); a model trains with its estimator's own loss
(``ortflow.objectives.estimator_loss``, with the estimator's settings) unless ``loss.name`` says another, whose settings are
``loss.*`` only (issue 44)."""

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from mlflow import MlflowClient

from ortflow.objectives.penalties import BaseLearningPenalty
from ortflow.registry import family
from pipelines.base.checks import validate
from pipelines.base.schema import ConfigError
from pipelines.data.datasets import Split
from pipelines.orchestration.chain import run_chain


def _chain(compose_pipeline, tmp_path, uri, name, *overrides):
    cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}", *overrides)
    return run_chain(cfg, work_dir=tmp_path / name)


def _predict(path, X):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: X.astype(np.float32)})[0]).reshape(len(X))


def test_loss_quantile_trains_the_loss_s_quantile(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """Seen: a named quantile loss trained the median (PinballLearningLoss's default 0.5). ``loss=quantile
    loss.quantile=0.9``, from a least-squares start, puts about 90% of the test targets below the predictions."""
    q = 0.9
    _chain(compose_pipeline, tmp_path, sqlite_uri, "q", "data.n_samples=2500", "data.n_features=5",
           "loss=quantile", f"loss.quantile={q}", "trainer.max_iter=30", "trainer.learning_rate=0.02",
           "stages=[convert,add_loss,train]")
    split = Split.load(tmp_path / "q" / "convert" / "split.npz")
    below = float(np.mean(split.y_test <= _predict(tmp_path / "q" / "train" / "graphs" / "trained_model.onnx",
                                                   split.X_test)))
    n = len(split.y_test)
    band = 4 * math.sqrt(q * (1 - q) / n)  # 4 binomial standard deviations of the fraction of n rows below
    assert abs(below - q) < band, (below, n, band)


@pytest.mark.parametrize("epsilon", [1.1, 2.5])
def test_model_huber_trains_its_own_loss_with_its_epsilon(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri,
                                                          epsilon):
    """Seen: conf/model/huber.yaml advised loss.name=huber while ortflow.objectives.estimator_loss maps HuberRegressor to
    scaled_huber, and either way the loss trained at its class's default epsilon. Left unchosen, the loss is
    the estimator's own (scaled_huber) with the model's epsilon and fitted scale, in the graph trained."""
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "h", "data=diabetes", "model=huber",
                    f"model.epsilon={epsilon}", "trainer.max_iter=2", "stages=[convert,add_loss,train]")
    tags = MlflowClient(sqlite_uri).get_run(result.stage_run_ids["add_loss"]).data.tags
    assert tags["ortflow.loss"] == "scaled_huber"
    assert json.loads(tags["ortflow.loss_settings"])["epsilon"] == epsilon
    graph = onnx.load(tmp_path / "h" / "add_loss" / "model_with_loss.onnx")
    recorded = json.loads({p.key: p.value for p in graph.metadata_props}["ortflow.loss"])
    assert (recorded["loss"], recorded["params"]["epsilon"], recorded["chosen_from"]) == ("scaled_huber", epsilon, None)
    assert recorded["params"]["scale"] > 0  # HuberRegressor's fitted scale_, not the class's 1.0 by chance
    assert recorded["params"]["scale"] != 1.0


def test_the_loss_follows_epsilon(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """A different loss.epsilon trains a different loss: the same start graph scored by the two loss graphs
    (the start's fit also depends on epsilon, so the loss graphs are compared on one graph)."""
    from pipelines.base.builders import loss
    from pipelines.stages.add_loss import with_loss

    _chain(compose_pipeline, tmp_path, sqlite_uri, "h", "data=diabetes", "model=huber", "stages=[convert]")
    graph = onnx.load(tmp_path / "h" / "convert" / "model.onnx")
    split = Split.load(tmp_path / "h" / "convert" / "split.npz")
    values = []
    for epsilon in (0.5, 3.0):
        cfg = compose_pipeline("data=diabetes", "model=huber", "loss.name=scaled_huber", f"+loss.epsilon={epsilon}")
        assert loss(cfg).epsilon == epsilon
        onx = with_loss(cfg, graph)
        session = onnxruntime.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
        values.append(float(session.run(["loss"], {"X": split.X_train, "label": split.y_train.reshape(-1, 1)})[0]))
    assert values[0] != values[1]


def test_a_setting_its_loss_does_not_take_is_refused(compose_pipeline):
    with pytest.raises(ConfigError, match=r"loss\.foo: not a setting of loss=square \(SquareLearningLoss takes no "):
        validate(compose_pipeline("loss.name=square", "+loss.foo=1"))
    with pytest.raises(ConfigError, match=r"loss\.l1_weight.*loss\.name is unset"):
        validate(compose_pipeline("+loss.l1_weight=1"))
    with pytest.raises(ConfigError, match=r"loss\.quantile=1\.5 must be in \(0, 1\)"):
        validate(compose_pipeline("loss=quantile", "loss.quantile=1.5"))


def test_a_loss_setting_is_never_taken_from_the_model(compose_pipeline):
    """Seen (issue 44): a loss with ``alpha=1.0`` got ``model.alpha=0.0001`` (the model's L2 strength), silently: a
    named loss's settings were looked up in ``loss`` then in ``model``. A loss's settings come from ``loss.*`` only
    (or, with no loss named, from the estimator's record)."""
    from ortflow.objectives.losses import SquareLearningLoss
    from pipelines.base.builders import loss

    class AlphaSquare(SquareLearningLoss):  # a loss with a setting named like a model's
        names = ("test_alpha_square",)

        def __init__(self, alpha: float = 1.0):
            self.alpha = alpha

    cfg = compose_pipeline("loss.name=test_alpha_square", "model.alpha=0.0001")
    validate(cfg)
    assert loss(cfg).alpha == 1.0
    assert loss(compose_pipeline("loss.name=test_alpha_square", "+loss.alpha=0.5", "model.alpha=0.0001")).alpha == 0.5
    # huber's epsilon: model=huber's 1.1 is HuberRegressor's; the named huber loss keeps its own
    cfg = compose_pipeline("data=diabetes", "model=huber", "model.epsilon=1.1", "loss.name=huber")
    assert loss(cfg).epsilon == family("loss")["huber"]().epsilon != 1.1


class PullToOne(BaseLearningPenalty):
    """``strength * sum((w - 1) ** 2)``: a penalty defined here only, registered under its name as any class of the
    family, with a setting of its own."""

    names = ("test_pull_to_one",)

    def __init__(self, strength: float = 0.0, weights=None):
        self.strength = strength
        self.weights = weights

    def is_null(self):
        return not self.strength

    def _value(self, ops, weight):  # the rule once: graphs (full, fwbw) and tensors (torch) follow from it
        gap = ops.add(weight, ops.const(-1.0))
        return ops.mul(ops.sum(ops.mul(gap, gap)), ops.const(self.strength))

    def _gradient(self, ops, weight, grad):
        return ops.add(grad, ops.mul(ops.add(weight, ops.const(-1.0)), ops.const(2.0 * self.strength)))


@pytest.mark.parametrize("trainer", ["full", "fwbw", "torch"])
def test_a_penalty_class_defined_outside_the_pipelines_trains_from_penalty_name(
        compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri, trainer):
    """Seen: the train stage built ElasticLearningPenalty whatever penalty.name said. A penalty defined here trains
    through the chain with its own formula: the trained weights solve mean((X w + b - y) ** 2) + s * |w - 1|^2 (the
    least-squares normal equations with s (w - 1) added; the intercept is not penalized)."""
    s = 0.5
    _chain(compose_pipeline, tmp_path, sqlite_uri, "p", "data.n_samples=300", "data.n_features=4", "loss=square",
           f"trainer={trainer}", "penalty.name=test_pull_to_one", f"+penalty.strength={s}", "trainer.max_iter=60",
           "trainer.learning_rate=0.01", "trainer.batch_size=16", "stages=[convert,add_loss,train]")
    split = Split.load(tmp_path / "p" / "convert" / "split.npz")
    X, y = split.X_train.astype(np.float64), split.y_train.astype(np.float64)
    n, d = X.shape
    A = np.hstack([X, np.ones((n, 1))])
    lhs, rhs = A.T @ A / n, A.T @ y / n
    lhs[:d, :d] += s * np.eye(d)
    rhs[:d] += s
    expected = np.linalg.solve(lhs, rhs)
    trained = {i.name: onnx.numpy_helper.to_array(i) for i in
               onnx.load(tmp_path / "p" / "train" / "graphs" / "trained_model.onnx").graph.initializer}
    free = np.linalg.lstsq(A, y, rcond=None)[0]  # the weights without the penalty, for scale
    assert np.abs(expected - free).max() > 0.1  # the penalty moves the optimum visibly
    # constant-rate SGD ends within a few step sizes of the optimum: lr * |gradient| per step, a few 0.01
    np.testing.assert_allclose(trained["coef"].ravel(), expected[:d], atol=0.03)
    np.testing.assert_allclose(trained["intercept"].ravel(), expected[d:], atol=0.03)


def test_a_setting_its_penalty_does_not_take_is_refused(compose_pipeline):
    with pytest.raises(ConfigError, match=r"penalty\.strength: not a setting of penalty=elastic"):
        validate(compose_pipeline("penalty=elastic", "+penalty.strength=1"))
    with pytest.raises(ConfigError, match=r"penalty=elastic adds nothing"):
        validate(compose_pipeline("penalty=elastic", "penalty.l1=0", "penalty.l2=0"))


# --- each list once: the others derived, or checked here ----------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_the_optimizers_listed_by_the_docs_are_the_registry_s():
    """Seen: docs/PIPELINES.md, conf/trainer/*.yaml and ortflow/trainers/parameters.py listed sgd | nesterov | adam | adamw,
    rmsprop missing. The YAML files and the parameter table name no optimizer now; the page's one list is the
    registry's canonical names."""
    canonical = sorted({cls.names[0] for cls in family("optimizer").values()})
    row = next(line for line in (ROOT / "docs" / "PIPELINES.md").read_text().splitlines()
               if line.startswith("| `trainer` |"))
    listed = re.search(r"an optimizer name of ortflow's registry: ([^)]*)\)", row)[1]
    assert re.findall(r"`(\w+)`", listed) == canonical
    for path in (ROOT / "conf" / "trainer").glob("*.yaml"):
        assert not re.search(r"\b(nesterov|adamw|rmsprop)\b", path.read_text()), path


@pytest.mark.parametrize("optimizer", sorted({cls.names[0] for cls in family("optimizer").values()}))
def test_every_optimizer_of_the_registry_is_a_valid_trainer_optimizer(compose_pipeline, optimizer):
    from pipelines.base.builders import learning_rate, optimizer_keys

    cfg = compose_pipeline(f"trainer.optimizer={optimizer}", "trainer.learning_rate=0.05")
    validate(cfg)
    rate = learning_rate(cfg)
    assert rate.names[0] == optimizer and rate.eta0 == 0.05
    # every setting of every optimizer is a trainer key (issue 44: Adam's betas, Adagrad's epsilon could not be set)
    from dataclasses import fields

    from ortflow.registry import settings_of
    from pipelines.base.schema import TrainerConfig

    ours = [cls for cls in family("optimizer").values() if cls.__module__.startswith("ortflow.")]  # not tests'
    assert set(optimizer_keys().values()) == {p for cls in ours for p in settings_of(cls)}
    assert set(optimizer_keys()) <= {f.name for f in fields(TrainerConfig)}


def test_the_trainer_files_repeat_no_default_of_the_schema():
    """The pipelines' trainer defaults are written once, in the schema (TrainerConfig): a trainer's file sets only
    its name and what differs."""
    from omegaconf import OmegaConf

    from pipelines.base.schema import TrainerConfig

    defaults = OmegaConf.to_container(OmegaConf.structured(TrainerConfig), resolve=False, enum_to_str=True)
    for path in (ROOT / "conf" / "trainer").glob("*.yaml"):
        own = OmegaConf.to_container(OmegaConf.load(path))
        assert not {k for k, v in own.items() if k != "name" and defaults.get(k) == v}, path


def test_the_docs_name_every_loss_and_every_model():
    """docs/LOSSES.md's table of the loss family names every loss of the registry, and docs/PIPELINES.md's `model`
    row every model of the table (what docs/DESIGN.md's walk-throughs say a new one adds)."""
    from pipelines.base.models import MODELS

    losses = (ROOT / "docs" / "LOSSES.md").read_text()
    table = {name for line in losses.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line)}
    ours = {cls.names[0] for cls in family("loss").values() if cls.__module__.startswith("ortflow.")}  # not tests'
    assert not ours - table
    row = next(line for line in (ROOT / "docs" / "PIPELINES.md").read_text().splitlines()
               if line.startswith("| `model` |")).split(" | ")[1]
    assert not {m.name for m in MODELS} - set(re.findall(r"`(\w+)`", row))


def test_a_loss_setting_of_its_own_is_a_loss_key(compose_pipeline):
    """log_cosh's scale, a setting no other loss has, is set as loss.scale with nothing in the pipelines for it."""
    from pipelines.base.builders import loss

    cfg = compose_pipeline("loss=log_cosh", "loss.scale=0.5")
    validate(cfg)
    built = loss(cfg)
    assert (built.names[0], built.scale) == ("log_cosh", 0.5)
    with pytest.raises(ConfigError, match=r"loss\.name=log_cosh: .*loss\.scale=-1"):
        validate(compose_pipeline("loss=log_cosh", "loss.scale=-1"))


def test_model_linear_svr_trains_its_own_loss(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """A model added as a line of the table and a file of conf/model: its chain trains the estimator's own loss
    (ortflow.objectives.estimator_loss: epsilon-insensitive) at the model's epsilon."""
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "svr", "data=diabetes", "model=linear_svr",
                    "model.epsilon=0.2", "model.start_max_iter=3", "trainer.max_iter=10",
                    "stages=[convert,add_loss,train]")
    tags = MlflowClient(sqlite_uri).get_run(result.stage_run_ids["add_loss"]).data.tags
    assert tags["ortflow.loss"] == "epsilon_insensitive"
    assert json.loads(tags["ortflow.loss_settings"]) == {"epsilon": 0.2}
    history = json.loads((tmp_path / "svr" / "train" / "history.json").read_text())
    assert history[-1]["train_loss"] < history[0]["train_loss"]
