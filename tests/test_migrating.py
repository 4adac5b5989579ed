"""The seed documents' snippets (onnxcustom's), run with only their imports changed (docs/MIGRATING.md)."""

import numpy as np
import onnx
from sklearn.datasets import make_regression
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import train_test_split

# onnxcustom: from onnxcustom.utils.orttraining_helper import add_loss_output
#             from onnxcustom.training.optimizers import OrtGradientOptimizer
#             from onnxcustom.training.optimizers_partial import OrtGradientForwardBackwardOptimizer
#             from onnxcustom.training.sgd_learning_rate import LearningRateSGDNesterov
#             from onnxcustom.training.sgd_learning_loss import ElasticLearningLoss
#             from onnxcustom.training.sgd_learning_penalty import ElasticLearningPenalty
from ortflow import (
    ElasticLearningLoss,
    ElasticLearningPenalty,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)


def _data():
    X, y = make_regression(400, n_features=10, bias=2, random_state=0)
    X, y = X.astype(np.float32), (y / 100).astype(np.float32)
    w = (np.random.RandomState(0).rand(len(y)) + 0.5).astype(np.float32)
    X_train, X_test, y_train, y_test, w_train, w_test = train_test_split(X, y, w, random_state=0)
    lr = LinearRegression().fit(X_train[:10], np.zeros(10, dtype=np.float32))  # a poor start
    return to_onnx(lr, X_train[:1]), X_train, y_train, w_train


def test_full_training_snippet():
    onx, X_train, y_train, w_train = _data()
    onx_loss = add_loss_output(
        onx, weight_name='weight', score_name='elastic',
        l1_weight=0.1, l2_weight=0.9,
        penalty={'coef': {'l2': 0.01}})
    train_session = OrtGradientOptimizer(
        onx_loss, ['intercept', 'coef'], learning_rate=1e-3)
    train_session.fit(X_train, y_train, w_train)
    state_tensors = train_session.get_state()
    losses = train_session.train_losses_
    assert set(state_tensors) == {"intercept", "coef"}
    assert len(losses) == 100 and losses[-1] < losses[0]


def test_forward_backward_snippet():
    onx, X_train, y_train, w_train = _data()
    train_session = OrtGradientForwardBackwardOptimizer(
        onx, ['coef', 'intercept'],
        learning_rate=LearningRateSGDNesterov(),
        learning_loss=ElasticLearningLoss(l1_weight=0.1, l2_weight=0.9),
        learning_penalty=ElasticLearningPenalty(l1=0.1, l2=0.9))
    train_session.fit(X_train, y_train, w_train)
    state_tensors = train_session.get_state()
    losses = train_session.train_losses_
    graphs = train_session.save_onnx_graph()  # "saved on disk or just serialized in memory"
    assert set(state_tensors) == {"coef", "intercept"}
    assert losses[-1] < losses[0]
    onnx.checker.check_model(onnx.load_from_string(graphs["trained_model"]))
