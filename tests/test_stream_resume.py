"""A streamed fit checkpointed inside an epoch (``Checkpoint(every_rows=...)``), killed, and resumed where it
stopped: the same weights, history and random state as an uninterrupted run; the checkpoints a resume refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ortflow
from ortflow import Checkpoint
from ortflow.trainers.callbacks import Callback
from ortflow.exceptions import CheckpointError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

N, D = 1200, 3
FEATURES = [f"x{i}" for i in range(D)]
ROOT = Path(__file__).resolve().parents[1]

# The run both processes make: a shuffled stream of 2 files of 150-row row groups (8 groups), buffers of 300 rows,
# batches of 64 (a chunk does not end on a batch boundary: the units carry rows over), 3 epochs.
SETUP = textwrap.dedent('''
    import numpy as np, onnx
    import ortflow
    from ortflow.optimizers.learning_rates import LearningRateAdam
    from ortflow.data.sources import ParquetSource

    def make(kind, folder, callbacks=None, max_iter=3):
        start = onnx.load(str(folder / "start.onnx"))
        rate = LearningRateAdam(eta0=0.05) if kind == "full" else 0.02
        settings = dict(learning_rate=rate, batch_size=64, max_iter=max_iter, random_state=3, shuffle=True,
                        callbacks=callbacks)
        if kind == "full":
            return ortflow.OrtGradientOptimizer(ortflow.add_loss_output(start, "squared_error"), **settings)
        return ortflow.OrtGradientForwardBackwardOptimizer(start, learning_loss="squared_error", **settings)

    def source(folder, buffer_rows=300):
        return ParquetSource(folder / "data", target="y", columns=["x0", "x1", "x2"], buffer_rows=buffer_rows)
''')

# The first process: checkpoints every 200 rows, killed (SIGKILL, no cleanup) in epoch 2 after its 5th unit,
# right after that unit's checkpoint was written.
KILLED = SETUP + textwrap.dedent('''
    import os, signal, sys
    from pathlib import Path
    from ortflow.trainers.callbacks import Callback

    class Kill(Callback):
        def on_chunk_end(self, trainer, position):
            if position.epoch == 2 and position.chunks == 5:
                os.kill(os.getpid(), signal.SIGKILL)

    folder = Path(sys.argv[2])
    make(sys.argv[1], folder, [ortflow.Checkpoint(folder / "ckpt", every_rows=200), Kill()]).fit(source(folder))
''')


def _setup_namespace():
    space: dict = {}
    exec(SETUP, space)  # noqa: S102 - the test's own code, shared with the killed process
    return space


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from sklearn.linear_model import LinearRegression

    root = tmp_path_factory.mktemp("stream-resume")
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, D)).astype(np.float32)
    frame = pd.DataFrame(X, columns=FEATURES).assign(y=(X @ np.array([1.5, -2.0, 0.5]) + 0.3).astype(np.float32),
                                                   id=np.arange(N))
    (root / "data").mkdir()
    for k, part in enumerate(np.array_split(np.arange(N), 2)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False),
                       root / "data" / f"part{k}.parquet", row_group_size=150)
    import onnx

    onnx.save(ortflow.to_onnx(LinearRegression().fit(X[:20], np.zeros(20)), X[:20]), str(root / "start.onnx"))
    return root


def _same_run(resumed, whole):
    for name, value in whole.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value, err_msg=name)
    assert [r["train_loss"] for r in resumed.history_] == [r["train_loss"] for r in whole.history_]
    assert [r["learning_rate"] for r in resumed.history_] == [r["learning_rate"] for r in whole.history_]
    a, b = resumed._rng_state, whole._rng_state
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_run_killed_inside_an_epoch_resumes_where_it_stopped(folder, kind, tmp_path):
    """The first process dies by SIGKILL in epoch 2; this one resumes from its last mid-epoch checkpoint (896 rows
    into epoch 2), replays the epoch's order, skips the rows trained, and ends bit-identical to a run never
    interrupted: weights (full's through Adam's restored moments and step), fwbw's optimizer state, every epoch's
    train_loss and learning rate, the random state."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "data").symlink_to(folder / "data")
    (run / "start.onnx").symlink_to(folder / "start.onnx")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED, kind, str(run)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    manifest = ortflow.trainers.checkpoint.read_manifest(run / "ckpt")
    # units of 256, 64, 256, 64, 256, 64, 192 and 48 rows (buffers of 300 rows; the rows left at a buffer's end and
    # the next buffer's first ones make a unit of one batch): written after the 1st, 3rd and 5th, each one past 200
    # rows since the last write; the 5th ends at row 896
    assert manifest["epoch"] == 1 and manifest["position"]["rows"] == 896 and manifest["position"]["chunks"] == 5

    space = _setup_namespace()
    whole = space["make"](kind, folder).fit(space["source"](folder))
    resumed = space["make"](kind, folder).fit(space["source"](folder), resume_from=run / "ckpt")
    assert resumed.n_iter_ == 3
    _same_run(resumed, whole)
    if kind == "fwbw":
        for name, value in whole.get_optimizer_state().items():
            np.testing.assert_array_equal(resumed.get_optimizer_state()[name], value, err_msg=name)


class _Stop(Exception):
    pass


class _StopAt(Callback):
    """Raises at a chunk boundary of a streamed fit, after the callbacks listed before it (a Checkpoint) ran."""

    def __init__(self, epoch, chunks):
        self.epoch, self.chunks = epoch, chunks

    def on_chunk_end(self, trainer, position):
        if (position.epoch, position.chunks) == (self.epoch, self.chunks):
            raise _Stop


def _stopped(folder, ckpt, epoch=1, chunks=2, **checkpoint):
    """A fwbw run checkpointed inside epochs and stopped by an exception after ``chunks`` chunks of ``epoch``."""
    space = _setup_namespace()
    est = space["make"]("fwbw", folder, [Checkpoint(ckpt, **checkpoint), _StopAt(epoch, chunks)])
    with pytest.raises(_Stop):
        est.fit(space["source"](folder))
    return space, est


def test_an_exception_between_chunk_boundaries_keeps_the_last_checkpoint(folder, tmp_path):
    """An exception inside unit 4 of epoch 1, after its batches moved the weights: save_checkpoint refuses and
    Checkpoint's end-of-training write does not happen; the checkpoint left is unit 3's (576 rows), which resumes
    to the uninterrupted weights."""
    ckpt = tmp_path / "ckpt"
    space = _setup_namespace()
    est = space["make"]("fwbw", folder, [Checkpoint(ckpt, every_rows=1)])
    original, calls = type(est)._train_rows, []

    def interrupted(self, data, order, learning_rate):
        losses = original(self, data, order, learning_rate)
        calls.append(1)
        if len(calls) == 4:
            raise _Stop
        return losses

    est._train_rows = interrupted.__get__(est)
    with pytest.raises(_Stop):
        est.fit(space["source"](folder))
    assert est.in_epoch_
    with pytest.raises(RuntimeError, match="middle of an epoch"):
        est.save_checkpoint(tmp_path / "other")
    manifest = ortflow.trainers.checkpoint.read_manifest(ckpt)
    assert manifest["epoch"] == 0 and manifest["position"]["rows"] == 576
    whole = space["make"]("fwbw", folder).fit(space["source"](folder))
    _same_run(space["make"]("fwbw", folder).fit(space["source"](folder), resume_from=ckpt), whole)


def test_a_checkpoint_after_an_epochs_last_chunk_resumes_to_its_end(folder, tmp_path):
    """every_rows=1 writes after every chunk; stopped right after the last chunk of epoch 1 (before its record),
    the resume has nothing left to read in that epoch and still records its train_loss as the whole run does."""
    ckpt = tmp_path / "ckpt"
    space, _ = _stopped(folder, ckpt, epoch=1, chunks=8, every_rows=1)  # the 8th unit: the last 48 rows
    assert ortflow.trainers.checkpoint.read_manifest(ckpt)["position"]["rows"] == N
    whole = space["make"]("fwbw", folder).fit(space["source"](folder))
    _same_run(space["make"]("fwbw", folder).fit(space["source"](folder), resume_from=ckpt), whole)


def test_a_source_without_skip_rows_is_read_and_dropped_up_to_the_position(folder, tmp_path):
    """A memory-mapped source cannot skip rows itself: the trainer reads the rows trained before the checkpoint and
    drops them (unconverted); the resumed run still ends as the uninterrupted one."""
    frame = pd.read_parquet(folder / "data")
    X, y = frame[FEATURES].to_numpy(np.float32), frame["y"].to_numpy(np.float32)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    source = ortflow.data.sources.NumpySource(tmp_path / "X.npy", tmp_path / "y.npy", block_rows=250)
    assert not hasattr(source, "skips_rows")
    space = _setup_namespace()
    est = space["make"]("full", folder, [Checkpoint(tmp_path / "ckpt", every_rows=100), _StopAt(2, 3)])
    with pytest.raises(_Stop):
        est.fit(source)
    whole = space["make"]("full", folder).fit(source)
    _same_run(space["make"]("full", folder).fit(source, resume_from=tmp_path / "ckpt"), whole)


def test_a_torch_trainer_resumes_inside_an_epoch(folder, tmp_path):
    """TorchTrainer runs the same epoch loop: stopped inside epoch 2 and resumed, its weights and Adam state end as
    an uninterrupted run's (skipped where torch is not installed)."""
    pytest.importorskip("torch")
    import onnx

    from ortflow.optimizers.learning_rates import LearningRateAdam
    from ortflow.trainers.torch_trainer import TorchTrainer

    space = _setup_namespace()

    def make(callbacks=None):
        return TorchTrainer(onnx.load(str(folder / "start.onnx")), learning_rate=LearningRateAdam(eta0=0.05),
                            batch_size=64, max_iter=3, random_state=3, callbacks=callbacks)

    with pytest.raises(_Stop):
        make([Checkpoint(tmp_path / "ckpt", every_rows=300), _StopAt(2, 4)]).fit(space["source"](folder))
    whole = make().fit(space["source"](folder))
    _same_run(make().fit(space["source"](folder), resume_from=tmp_path / "ckpt"), whole)


@pytest.mark.parametrize("key", [None, "id"])
def test_a_parquet_source_skips_rows_without_reading_whole_buffers(folder, key, monkeypatch):
    """``chunks(rng, skip_rows=700)`` yields the epoch's rows from row 700 on and leaves the random state as the
    whole epoch does; its first two 300-row buffers (4 of the 8 row groups) are not read, unless a split by key
    makes their rows unknown until read."""
    from ortflow.data.sources import ParquetSource, ordered

    source = ParquetSource(folder / "data", target="y", columns=FEATURES, buffer_rows=300)
    if key is not None:
        source = source.split(0.25, key=key)[0]
    rng_whole, rng_skip = np.random.RandomState(5), np.random.RandomState(5)
    whole = np.concatenate([y for _, y, _ in map(ordered, source.chunks(rng_whole))])
    reads = []
    read = type(source)._read
    monkeypatch.setattr(type(source), "_read", lambda self, index: reads.append(index) or read(self, index))
    parts = list(source.chunks(rng_skip, skip_rows=700))
    np.testing.assert_array_equal(np.concatenate([y for _, y, _ in map(ordered, parts)]), whole[700:])
    np.testing.assert_array_equal(rng_skip.get_state()[1], rng_whole.get_state()[1])
    assert len(reads) == (4 if key is None else 8)


def test_a_source_of_unknown_length_resumes_its_learning_rate_schedule(folder, tmp_path):
    """A source whose rows are unknown until read (a split by key: ``n_rows`` None) used to resume its samples seen
    at 0, restarting an invscaling rate; a streamed checkpoint records them, at an epoch boundary too."""
    space = _setup_namespace()
    train = space["source"](folder).split(0.25, key="id")[0]
    assert train.n_rows is None

    def make(max_iter, callbacks=None):
        est = space["make"]("fwbw", folder, callbacks, max_iter=max_iter)
        return est.set_params(learning_rate=0.05, lr_schedule="invscaling", power_t=0.5)

    make(2, [Checkpoint(tmp_path / "ckpt")]).fit(train)
    whole = make(3).fit(train)
    _same_run(make(3).fit(train, resume_from=tmp_path / "ckpt"), whole)


def test_refused_resumes_name_what_differs(folder, tmp_path):
    ckpt = tmp_path / "ckpt"
    space, _ = _stopped(folder, ckpt, every_rows=200)
    make, source = space["make"], space["source"]
    frame = pd.read_parquet(folder / "data")
    with pytest.raises(CheckpointError, match=r"inside epoch 1 of a streamed fit .*an in-memory fit cannot "
                                              r"continue it; resume with fit\(source"):
        make("fwbw", folder).fit(frame[FEATURES].to_numpy(np.float32), frame["y"], resume_from=ckpt)
    with pytest.raises(CheckpointError, match=r"of another source \(buffer_rows: 300 then, 400 now\)"):
        make("fwbw", folder).fit(source(folder, buffer_rows=400), resume_from=ckpt)
    with pytest.raises(CheckpointError,
                       match=r"of another source \(files: 2 then, 1 now; n_rows: 1200 then, 600 now; row_groups"):
        make("fwbw", folder).fit(ortflow.data.sources.ParquetSource(folder / "data" / "part0.parquet", target="y",
                                                               columns=FEATURES, buffer_rows=300),
                                 resume_from=ckpt)
    other = make("fwbw", folder)
    other.batch_size = 32
    with pytest.raises(CheckpointError, match="with batch_size=64, not 32"):
        other.fit(source(folder), resume_from=ckpt)
    _stopped(folder, tmp_path / "in-epoch-2", epoch=2, every_rows=200)
    with pytest.raises(ValueError, match="stopped inside epoch 2, which max_iter=1 does not reach"):
        make("fwbw", folder, max_iter=1).fit(source(folder), resume_from=tmp_path / "in-epoch-2")
    with pytest.raises(ValueError, match="every_rows=0 must be a positive integer"):
        Checkpoint(ckpt, every_rows=0)


def test_the_epoch_losses_are_covered_by_the_checksums(folder, tmp_path):
    ckpt = tmp_path / "ckpt"
    space, _ = _stopped(folder, ckpt, every_rows=200)
    path = ckpt / "epoch_losses.npz"
    data = bytearray(path.read_bytes())
    data[-40] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="epoch_losses.npz does not match its checksum"):
        space["make"]("fwbw", folder).fit(space["source"](folder), resume_from=ckpt)



def test_a_shuffling_dataloader_is_refused_for_checkpoints_inside_an_epoch(folder, tmp_path):
    """A DataLoader with shuffle=True orders its epochs from torch's random state, which no checkpoint holds: a
    resume inside an epoch would skip other rows than those trained. Checkpoint(every_rows=...) on it is refused
    before any work, and so is a resume inside an epoch; shuffle=False replays, and resumes as the whole run."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    frame = pd.read_parquet(folder / "data")
    data = TensorDataset(torch.from_numpy(frame[FEATURES].to_numpy(np.float32, copy=True)),
                         torch.from_numpy(frame["y"].to_numpy(np.float32, copy=True)))
    shuffled = ortflow.data.sources.IterableSource(DataLoader(data, batch_size=200, shuffle=True))
    in_order = ortflow.data.sources.IterableSource(DataLoader(data, batch_size=200, shuffle=False))
    assert not shuffled.replays_order and in_order.replays_order
    space = _setup_namespace()
    with pytest.raises(ValueError, match=r"Checkpoint\(every_rows=...\) on .*shuffle=True"):
        space["make"]("fwbw", folder, [Checkpoint(tmp_path / "refused", every_rows=300)]).fit(shuffled)
    assert not (tmp_path / "refused").exists()

    ckpt = tmp_path / "ckpt"
    with pytest.raises(_Stop):
        space["make"]("fwbw", folder, [Checkpoint(ckpt, every_rows=300), _StopAt(2, 3)]).fit(in_order)
    with pytest.raises(ValueError, match="stopped inside epoch 2 .*resume from a checkpoint at an epoch's end"):
        space["make"]("fwbw", folder).fit(shuffled, resume_from=ckpt)
    whole = space["make"]("fwbw", folder).fit(in_order)
    _same_run(space["make"]("fwbw", folder).fit(in_order, resume_from=ckpt), whole)
