"""Hydra composition of conf/ against the structured schema, and the small pure helpers of pipelines/."""

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from omegaconf import OmegaConf

from pipelines.tracking import promotion
from pipelines.execution.bundle import Bundle, MissingInputError
from pipelines.base.checks import validate
from pipelines.base.schema import ConfigError
from pipelines.modeling.estimators import with_scaling
from pipelines.tracking import flatten, is_transient, resolve_tracking_uri

CONF = Path(__file__).resolve().parent.parent / "conf"


def _causes(exc: BaseException) -> str:
    """The messages of an exception and of its causes (Hydra wraps the OmegaConf error)."""
    text = []
    while exc is not None:
        text.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(text)


def test_default_config_composes_small_defaults(compose_pipeline):
    cfg = compose_pipeline()
    validate(cfg)  # model follows data.task (linear for the default regression data), the loss is the model's own
    assert (str(cfg.data.name), str(cfg.model.name), cfg.loss.name, str(cfg.trainer.name)) == (
        "regression", "linear", None, "full")
    assert (cfg.data.n_samples, cfg.data.n_features, cfg.trainer.max_iter) == (1000, 20, 20)
    assert cfg.mlflow.registered_model_name == "ortflow-regression-linear"
    assert cfg.trainer.seed == cfg.seed == cfg.data.seed
    assert [str(s) for s in cfg.stages] == ["convert", "add_loss", "train", "evaluate", "export"]
    assert cfg.promotion.alias == "champion"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes_and_validates(compose_pipeline, experiment):
    cfg = compose_pipeline(f"experiment={experiment}")
    validate(cfg)


@pytest.mark.parametrize("group,option", [
    (group.name, option.stem)
    for group in sorted(CONF.iterdir()) if group.is_dir() and group.name not in ("experiment", "hparams_search")
    for option in sorted(group.glob("*.yaml"))
])
def test_every_group_option_composes(compose_pipeline, group, option):
    cfg = compose_pipeline(f"{group}={option}")
    assert OmegaConf.select(cfg, group) is not None


def test_optuna_search_config_composes(compose_pipeline):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["hparams_search=optuna"], return_hydra_config=True)
    assert cfg.optimized_metric == "validation_loss"
    assert cfg.hydra.sweeper.direction == "minimize"
    assert "trainer.learning_rate" in cfg.hydra.sweeper.params


@pytest.mark.parametrize("override,key", [
    ("trainer.max_iter=abc", "trainer.max_iter"),
    ("trainer.learning_rate=fast", "trainer.learning_rate"),
    ("data.n_samples=1.5", "data.n_samples"),
    ("model.activation=gelu", "model.activation"),
    ("promotion.direction=up", "promotion.direction"),
    ("promotion.register=sometimes", "promotion.register"),
    ("trainer.early_stopping=maybe", "trainer.early_stopping"),
])
def test_wrong_typed_value_fails_at_composition_naming_the_key(compose_pipeline, override, key):
    with pytest.raises(Exception) as info:
        compose_pipeline(override)
    assert key in _causes(info.value)


def test_unknown_key_and_unknown_choice_fail(compose_pipeline):
    with pytest.raises(Exception) as info:
        compose_pipeline("trainer.epochs=3")
    assert "trainer.epochs" in _causes(info.value)
    with pytest.raises(Exception) as info:
        compose_pipeline("data=mnist")
    text = _causes(info.value)
    assert "data/mnist" in text and "breast_cancer" in text  # the message lists the available options


@pytest.mark.parametrize("overrides,words", [
    (["model=logistic"], ["model=logistic", "data"]),
    (["data=breast_cancer", "model=mlp_classifier", "loss=square"], ["loss=square", "loss=log", "data=breast_cancer"]),
    (["data.test_size=1.5"], ["data.test_size"]),
    # registry names are checked here, not at composition (listing the registry imports scikit-learn)
    (["trainer.optimizer=lbfgs"], ["trainer.optimizer='lbfgs'", "'nesterov'"]),
    (["loss=square", "loss.name=hinge_loss"], ["loss.name='hinge_loss'", "'absolute'"]),  # an unknown name
    (["data=file"], ["data.path", "data.target"]),
])
def test_incompatible_groups_fail_with_the_keys(compose_pipeline, overrides, words):
    cfg = compose_pipeline(*overrides) if overrides != ["data=file"] else compose_pipeline(
        "data=file", "data.path=''", "data.target=''")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    for word in words:
        assert word in str(info.value)


def test_tracking_uri_defaults_to_sqlite_under_root_and_env_wins(compose_pipeline, clean_mlflow_env, monkeypatch,
                                                               tmp_path):
    cfg = compose_pipeline(f"mlflow.root={tmp_path}")
    assert resolve_tracking_uri(cfg) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_pipeline("mlflow.tracking_uri=http://127.0.0.1:5999")
    assert resolve_tracking_uri(cfg) == "http://127.0.0.1:5999"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert resolve_tracking_uri(cfg) == "sqlite:///elsewhere.db"


def test_flatten_and_transient_errors():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": 1, "a.c": [1, 2], "d": None}
    import sqlite3

    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert not is_transient(ValueError("bad value"))


def test_promotion_rules():
    assert promotion.default_metric("regression") == "test_mse"
    assert promotion.default_metric("classification") == "test_log_loss"
    assert promotion.default_direction("test_r2") == "maximize"
    assert promotion.default_direction("test_roc_auc") == "maximize"
    assert promotion.default_direction("test_mse") == "minimize"
    # seen: the names ending in _macro or _class_<label> were minimized (an endswith test on 'f1', 'recall'...)
    assert promotion.default_direction("test_f1_macro") == "maximize"
    assert promotion.default_direction("test_recall_class_setosa") == "maximize"
    assert promotion.default_direction("sklearn_test_log_loss") == "minimize"
    assert promotion.better(1.0, 2.0, "minimize") and not promotion.better(2.0, 2.0, "minimize")
    assert promotion.better(0.9, 0.8, "maximize") and not promotion.better(0.8, 0.9, "maximize")


def test_bundle_from_path_finds_known_files(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "split.npz").write_bytes(b"x")
    bundle = Bundle.from_path(tmp_path)
    assert bundle.path("model", "add_loss") == tmp_path / "model.onnx"
    assert "split" in bundle and "trained_model" not in bundle
    with pytest.raises(MissingInputError, match="trained_model.*train"):
        bundle.path("trained_model", "evaluate")
    assert "model" in Bundle.from_path(tmp_path / "model.onnx")
    manifest = json.loads(bundle.to_json())
    assert set(manifest) == {"model", "split"}


def test_with_scaling_folds_standardization_into_the_graph():
    from onnx import TensorProto, helper, numpy_helper

    w = np.array([[1.0], [2.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "coef_0"], ["variable"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(w, "coef_0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mean, scale = np.array([1.0, -1.0], np.float32), np.array([2.0, 4.0], np.float32)
    wrapped = with_scaling(model, mean, scale, y_mean=10.0, y_scale=3.0)
    X = np.array([[3.0, 3.0], [1.0, -1.0]], dtype=np.float32)
    got = onnxruntime.InferenceSession(wrapped.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0]
    expected = (((X - mean) / scale) @ w) * 3.0 + 10.0
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert [i.name for i in wrapped.graph.initializer if i.name.startswith("coef")] == ["coef_0"]
    onnx.checker.check_model(wrapped)
    assert math.isfinite(float(got.sum()))


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_optimizer_settings_reach_the_trainer_through_the_registry(compose_pipeline, trainer):
    """Seen: trainer.optimizer=adamw trained exactly as Adam (weight_decay never reached the trainer)."""
    import ortflow
    from pipelines.stages.train import build_trainer

    cfg = compose_pipeline(f"trainer={trainer}", "trainer.optimizer=adamw", "trainer.weight_decay=0.3",
                           "trainer.learning_rate=0.02")
    validate(cfg)
    estimator = build_trainer(cfg, ortflow.to_onnx(_tiny_linear()), [])
    expected = ortflow.OrtGradientOptimizer if trainer == "full" else ortflow.OrtGradientForwardBackwardOptimizer
    assert type(estimator) is expected
    rate = estimator.learning_rate
    assert isinstance(rate, ortflow.LearningRateAdamW)
    assert (rate.eta0, rate.weight_decay) == (0.02, 0.3)


@pytest.mark.parametrize("trainer", ["full", "fwbw", "torch"])
def test_n_threads_reaches_every_trainer_and_defaults_to_the_work(compose_pipeline, trainer):
    import ortflow
    from pipelines.stages.train import build_trainer

    graph = ortflow.to_onnx(_tiny_linear())
    chosen = build_trainer(compose_pipeline(f"trainer={trainer}", "trainer.n_threads=2"), graph, [])
    default = build_trainer(compose_pipeline(f"trainer={trainer}"), graph, [])
    assert (chosen.n_threads, default.n_threads) == (2, None)


def _tiny_linear():
    import numpy as np
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(np.eye(3, dtype=np.float32), np.arange(3.0))


@pytest.mark.parametrize("overrides,trainer,expected", [
    # the loss family's names reach the torch trainer (it has no names of its own)
    (["trainer=torch", "loss.name=squared_error"], "TorchTrainer",
     {"learning_loss": ("SquareLearningLoss", {})}),
    (["trainer=torch", "loss=elastic", "loss.l1_weight=0.25"], "TorchTrainer",
     {"learning_loss": ("ElasticLearningLoss", {"l1_weight": 0.25, "l2_weight": 0.5})}),
    # weight_decay reaches torch's optimizer through the learning-rate object
    (["trainer=torch", "trainer.optimizer=adamw", "trainer.weight_decay=0.5"], "TorchTrainer",
     {"learning_rate": ("LearningRateAdamW", {"weight_decay": 0.5, "eta0": 0.01})}),
    (["trainer=torch", "trainer.optimizer=sgd", "trainer.lr_schedule=optimal"], "TorchTrainer",
     {"learning_rate": ("LearningRateSGD", {"learning_rate": "optimal"})}),
    (["trainer=fwbw", "trainer.optimizer=nesterov", "trainer.momentum=0.5"], "OrtGradientForwardBackwardOptimizer",
     {"learning_rate": ("LearningRateSGDNesterov", {"momentum": 0.5, "learning_rate": "constant"})}),
    # settings left unset are not passed: the optimizer keeps its defaults
    (["trainer=full", "trainer.optimizer=adam"], "OrtGradientOptimizer",
     {"learning_rate": ("LearningRateAdam", {"eta0": 0.01})}),
    (["trainer=full", "trainer.gradients=ortflow"], "OrtGradientOptimizer", {"gradients": "ortflow"}),
    (["trainer=fwbw"], "OrtGradientForwardBackwardOptimizer", {"gradients": "auto"}),
    # the GPU's settings (issue 39): auto resolves at fit, TF32 is opt-in, fp32 when unset
    (["trainer=full", "trainer.device=auto", "trainer.precision=tf32"], "OrtGradientOptimizer",
     {"device": "auto", "precision": "tf32"}),
    (["trainer=fwbw"], "OrtGradientForwardBackwardOptimizer", {"precision": "fp32"}),
    # issue 44: the trainer group is generated from the core's tables: the portable shuffle, every optimizer
    # setting (Adam's betas, Adagrad's epsilon) and every core setting the pipelines do not set themselves
    (["trainer=full", "trainer.shuffle=portable"], "OrtGradientOptimizer", {"shuffle": "portable"}),
    (["trainer=torch", "trainer.shuffle=false"], "TorchTrainer", {"shuffle": False}),
    (["trainer=fwbw", "trainer.optimizer=adam", "trainer.beta1=0.95", "trainer.beta2=0.99"],
     "OrtGradientForwardBackwardOptimizer", {"learning_rate": ("LearningRateAdam", {"beta1": 0.95, "beta2": 0.99})}),
    (["trainer=full", "trainer.optimizer=adagrad", "trainer.epsilon=1e-6"], "OrtGradientOptimizer",
     {"learning_rate": ("LearningRateAdagrad", {"epsilon": 1e-6})}),
    (["trainer=full", "trainer.validation_every=2", "trainer.prefetch_depth=3", "trainer.spinning=false",
      "trainer.enable_logging=true"], "OrtGradientOptimizer",
     {"validation_every": 2, "prefetch_depth": 3, "spinning": False, "enable_logging": True}),
])
def test_a_valid_setting_reaches_the_trainer(compose_pipeline, overrides, trainer, expected):
    import ortflow
    from pipelines.stages.train import build_trainer

    cfg = compose_pipeline(*overrides)
    validate(cfg)
    estimator = build_trainer(cfg, ortflow.to_onnx(_tiny_linear()), [])
    assert type(estimator).__name__ == trainer
    for name, value in expected.items():
        got = getattr(estimator, name)
        if isinstance(value, tuple):
            assert type(got).__name__ == value[0]
            assert {k: got.get_params()[k] for k in value[1]} == value[1]
        else:
            assert got == value


def test_torch_trainer_fits_with_the_settings_it_was_given(compose_pipeline):
    """The weight decay set in conf reaches torch's optimizer (read back from the fitted trainer)."""
    pytest.importorskip("torch")
    import numpy as np

    import ortflow
    from pipelines.stages.train import build_trainer

    cfg = compose_pipeline("trainer=torch", "trainer.optimizer=adamw", "trainer.weight_decay=0.5",
                           "trainer.max_iter=2", "trainer.batch_size=2")
    validate(cfg)
    estimator = build_trainer(cfg, ortflow.to_onnx(_tiny_linear()), [])
    estimator.fit(np.eye(3, dtype=np.float32), np.arange(3.0, dtype=np.float32))
    assert estimator.optimizer_.rate.weight_decay == 0.5
    assert len(estimator.history_) == 2


def test_every_metric_evaluate_writes_is_a_valid_promotion_metric():
    import numpy as np

    from pipelines.base.checks import check_promotion_metric
    from pipelines.modeling.metrics import classification_metrics, regression_metrics

    y = np.array([0.0, 1.0, 2.0])
    written = {**regression_metrics(y, y), **regression_metrics(y, y, "sklearn_test_")}
    for name in written:
        check_promotion_metric(name, "regression")
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    written = classification_metrics(np.array(["a", "b", "a"]), proba, np.array(["a", "b"]), per_class=True)
    for name in written:
        check_promotion_metric(name, "classification")
    with pytest.raises(ConfigError, match="promotion.metric='test_r2' is not a metric of a classification"):
        check_promotion_metric("test_r2", "classification")


# --- model and loss follow data.task; every problem at once; hints that name what exists (issue 27, item 3) ----


@pytest.mark.parametrize("overrides,model,loss", [  # loss None: the model's own (ortflow.objectives.estimator_loss)
    (["data=iris"], "logistic", None),  # seen: data=iris alone failed on the default mlp_regressor
    (["data=breast_cancer", "model=mlp_classifier"], "mlp_classifier", None),  # an explicit model wins
    (["data=diabetes"], "linear", None),
    (["data=file", "data.path=t.csv", "data.target=y", "data.task=classification"], "logistic", None),
    (["data=digits", "loss=log", "model.start_max_iter=3", "model.C=0.5"], "logistic", "log"),
    (["experiment=smoke"], "mlp_regressor", "square"),  # an experiment's choice is explicit
])
def test_model_follows_data_task_unless_given(compose_pipeline, overrides, model, loss):
    cfg = compose_pipeline(*overrides)
    validate(cfg)
    assert (str(cfg.model.name), str(cfg.model.task), cfg.loss.name) == (model, str(cfg.data.task), loss)
    if "model.C=0.5" in overrides:  # keys given without model= are kept on top of the option's file
        assert (cfg.model.start_max_iter, cfg.model.C) == (3, 0.5)
        assert cfg.mlflow.registered_model_name == "ortflow-digits-logistic"


def test_a_contradictory_choice_names_both_sides(compose_pipeline):
    with pytest.raises(ConfigError) as info:
        validate(compose_pipeline("data=iris", "model=mlp_regressor"))
    message = str(info.value)
    assert "model=mlp_regressor is a regression model but data=iris" in message
    assert "model=logistic or model=mlp_classifier" in message


def test_every_problem_is_reported_at_once(compose_pipeline):
    """Seen: a launch reported its first config error only; fixing it revealed the next, one command at a time."""
    cfg = compose_pipeline("data=iris", "model=linear", "loss=square", "trainer.optimizer=adm",
                           "promotion.metric=test_mse", "data.test_size=1.5")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    problems = info.value.problems
    assert len(problems) == 5, problems
    for word in ("promotion.metric='test_mse'", "trainer.optimizer='adm'", "model=linear", "loss=square",
                 "data.test_size=1.5"):
        assert sum(word in p for p in problems) == 1, (word, problems)
    assert "did you mean trainer.optimizer=adam" in str(info.value)


def test_loss_hints_name_choices_that_exist(compose_pipeline):
    """Seen: 'use loss=log or loss=neg_log'; neg_log is an alias of log in the registry but not an option of the
    loss group (no conf/loss/neg_log.yaml), so the suggested command failed. Every ``loss=<x>`` suggested must
    compose, every ``loss.name=`` name must be a canonical registry name of the task."""
    import re

    from ortflow.registry import select

    cfg = compose_pipeline("data=iris", "loss=square")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    assert "neg_log" not in message
    for option in re.findall(r"loss=(\w+)", message):
        if option != "square":
            validate(compose_pipeline("data=iris", f"loss={option}"))
    named = re.search(r"loss\.name=<one of (\[.*?\])>", message)
    for name in eval(named[1]):
        loss = select("loss", name)
        assert loss.names[0] == name and loss.task == "classification"


def test_checkpoints_inside_an_epoch_are_for_a_streamed_table(compose_pipeline, tmp_path):
    """``trainer.checkpoint_every_rows`` on a table held in memory would do nothing (an in-memory epoch has one chunk):
    refused, naming data=parquet; accepted with data=parquet and checkpoint_every >= 1."""
    with pytest.raises(ConfigError, match=r"checkpoint_every_rows=100: .*data=parquet.*checkpoint_every >= 1"):
        validate(compose_pipeline("trainer.checkpoint_every=1", "trainer.checkpoint_every_rows=100"))
    with pytest.raises(ConfigError, match=r"checkpoint_every_rows=0 must be a positive number of rows"):
        validate(compose_pipeline("data=parquet", f"data.path={tmp_path}", "data.target=y",
                                  "trainer.checkpoint_every=1", "trainer.checkpoint_every_rows=0"))
    validate(compose_pipeline("data=parquet", f"data.path={tmp_path}", "data.target=y", "trainer.checkpoint_every=1",
                              "trainer.checkpoint_every_rows=100"))


def test_an_unknown_precision_is_refused_naming_the_choices(compose_pipeline):
    with pytest.raises(ConfigError, match=r"trainer.precision='fp16' is not one of \['fp32', 'tf32'\]"):
        validate(compose_pipeline("trainer=full", "trainer.precision=fp16"))


def test_a_command_validates_once(compose_pipeline, monkeypatch):
    """Seen: each command validated its config twice (the entry point, then the chain or the stage's runner)."""
    from pipelines.base import checks

    calls = []
    known = checks.check_known_keys
    monkeypatch.setattr(checks, "check_known_keys", lambda cfg: calls.append(1) or known(cfg))
    cfg = compose_pipeline("data=diabetes", "trainer.max_iter=7")
    validate(cfg)
    validate(cfg)
    assert len(calls) == 1
    cfg.trainer.max_iter = 8  # another config is checked again
    validate(cfg)
    assert len(calls) == 2


def test_every_core_trainer_setting_is_a_trainer_key_or_set_by_the_pipelines():
    """Seen (issue 44): the trainer group was a hand copy of the core's tables and had drifted (the portable shuffle
    refused as "not a valid bool", Adam's betas and Adagrad's epsilon unreachable). It is generated: every
    parameter of every trainer's table is a ``trainer`` key of its type, or one the pipelines set themselves (with
    what sets it); every optimizer setting of the registry is a key."""
    from dataclasses import fields

    from ortflow.trainers.parameters import TRAINERS
    from ortflow.registry import family, settings_of
    from pipelines.base.builders import optimizer_keys, trainer_keys
    from pipelines.base.schema import PIPELINE_SET, TrainerConfig

    core = {p.name for table in TRAINERS.values() for p in table}
    reached = set(trainer_keys().values())
    assert core - set(PIPELINE_SET) == reached | {"verbose"}  # verbose: None picks it from the terminal
    assert set(PIPELINE_SET) <= core, "PIPELINE_SET names a parameter no trainer has"
    assert not reached & set(PIPELINE_SET)
    ours = [cls for cls in family("optimizer").values() if cls.__module__.startswith("ortflow.")]  # not tests'
    assert set(optimizer_keys().values()) == {p for cls in ours for p in settings_of(cls)}
    assert set(optimizer_keys()) | set(trainer_keys()) <= {f.name for f in fields(TrainerConfig)}


@pytest.mark.parametrize("overrides,words", [
    (["trainer.shuffle=maybe"], ["trainer.shuffle='maybe' must be True, False or 'portable'"]),
    (["trainer.optimizer=sgd", "trainer.beta1=0.9"], ["trainer.beta1=0.9: trainer.optimizer=sgd takes no beta1"]),
    (["trainer=torch", "trainer.gradients=ortflow"], ["trainer.gradients=ortflow: trainer=torch takes no gradients"]),
    (["trainer.validation_every=1.5"], ["trainer.validation_every=1.5", "(0, 1)"]),
    (["trainer.prefetch_depth=0"], ["trainer.prefetch_depth"]),
])
def test_a_trainer_setting_the_core_refuses_is_refused_naming_the_key(compose_pipeline, overrides, words):
    with pytest.raises(ConfigError) as info:
        validate(compose_pipeline(*overrides))
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("override,close", [("trainer.beta=0.9", ["trainer.beta1", "trainer.beta2"]),
                                            ("trainer.epsilonn=1e-6", ["trainer.epsilon"])])
def test_a_mistyped_optimizer_setting_gets_a_did_you_mean(compose_pipeline, override, close):
    """A key outside the generated group is refused at composition; the hint names the generated keys close to it."""
    import io

    from pipelines.base.errors import report

    with pytest.raises(Exception) as info:
        compose_pipeline(override)
    out = io.StringIO()
    report(info.value, out)
    hint = out.getvalue().split("did you mean ", 1)[1].split("?")[0]
    assert sorted(hint.split(" or ")) == close


def test_a_chain_trains_with_the_portable_shuffle_and_adam_s_betas(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                    sqlite_uri):
    """``trainer.shuffle=portable`` and Adam's betas, given on the command line, reach the trainer of a real chain:
    its trained weights are those of the core trainer fitted on the same split from the same graph with
    ``shuffle='portable'`` and ``LearningRateAdam(beta1=0.95, beta2=0.99)``, not those of the default betas."""
    from mlflow import MlflowClient

    import ortflow
    from pipelines.data.datasets import Split
    from pipelines.orchestration.chain import run_chain

    settings = ["trainer=full", "trainer.optimizer=adam", "trainer.beta1=0.95", "trainer.beta2=0.99",
                "trainer.shuffle=portable", "trainer.max_iter=3", "trainer.learning_rate=0.05", "data.n_samples=300",
                "data.n_features=4"]
    cfg = compose_pipeline(f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}", *settings,
                           "stages=[convert,add_loss,train]")
    result = run_chain(cfg, work_dir=tmp_path / "c")

    logged = MlflowClient(sqlite_uri).get_run(result.stage_run_ids["train"]).data.params
    assert (logged["trainer.shuffle"], logged["trainer.beta1"], logged["trainer.beta2"]) == ("portable", "0.95", "0.99")
    split = Split.load(tmp_path / "c" / "convert" / "split.npz")
    graph = onnx.load(tmp_path / "c" / "add_loss" / "model_with_loss.onnx")
    trained = ortflow.get_initializers(onnx.load(tmp_path / "c" / "train" / "graphs" / "trained_model.onnx"))

    def fit(**rate):
        est = ortflow.OrtGradientOptimizer(graph, learning_rate=ortflow.LearningRateAdam(eta0=0.05, **rate),
                                           shuffle="portable", random_state=cfg.seed, max_iter=3, batch_size=32)
        return est.fit(split.X_train, split.y_train).get_state()

    ours, default = fit(beta1=0.95, beta2=0.99), fit()
    for name, value in ours.items():
        # the same computation in the same process: equal up to the float32 rounding of a few threads' sums
        atol = 64 * np.finfo(np.float32).eps * max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(trained[name].reshape(value.shape), value, rtol=0, atol=atol, err_msg=name)
    gap = max(float(np.abs(ours[n] - default[n]).max()) for n in ours)
    assert gap > 1000 * np.finfo(np.float32).eps, gap  # the betas changed the weights: the check above can tell
