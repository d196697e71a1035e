"""--average_every: training keeps snapshots of its last steps' weights, and the scripts that load a
run average the ones asked for, or refuse with one line."""
import dataclasses

import numpy as np
import pytest

import hyperparams
from conftest import assert_one_line_error, run_script
from test_settings import train


def fake_run(tmp_path, steps):
    """A run folder whose ckpt/snapshots holds (empty) files at steps: enough for choosing them."""
    folder = tmp_path / "ckpt" / "snapshots"
    folder.mkdir(parents=True)
    for step in steps:
        (folder / f"S{step:08d}.keras").write_bytes(b"")
    return hyperparams.Hparams(logdir=str(tmp_path))


def test_the_snapshots_chosen_are_the_newest_and_those_every_average_every_steps_before(tmp_path):
    from support.utils import UserError
    from trained.runs import chosen_snapshots
    hp = fake_run(tmp_path, [96, 97, 98, 99, 100])
    names = lambda paths: [p.rsplit("/", 1)[-1] for p in paths]  # noqa: E731
    assert names(chosen_snapshots(dataclasses.replace(hp, average_every=1, average_last=3))) == [
        "S00000098.keras", "S00000099.keras", "S00000100.keras"]
    assert names(chosen_snapshots(dataclasses.replace(hp, average_every=2, average_last=3))) == [
        "S00000096.keras", "S00000098.keras", "S00000100.keras"]
    for every, last in ((1, 6), (3, 3)):  # further back than the run kept
        with pytest.raises(UserError, match="averages snapshots at steps .* and the run holds 96, 97, 98, 99, 100"):
            chosen_snapshots(dataclasses.replace(hp, average_every=every, average_last=last))
    with pytest.raises(UserError, match="the run holds none"):
        chosen_snapshots(dataclasses.replace(hyperparams.Hparams(logdir=str(tmp_path / "new")), average_every=1))


def test_average_every_is_checked_with_the_other_settings():
    from support.utils import UserError
    with pytest.raises(UserError, match="--average_every must be 0"):
        hyperparams.validate(hyperparams.Hparams(average_every=-1))
    # snapshots are not epoch checkpoints: more of them than the epoch checkpoints kept is fine
    hyperparams.validate(hyperparams.Hparams(average_every=10, average_last=8, keep_checkpoints=5))


@pytest.mark.slow
def test_training_keeps_the_last_snapshots_and_eval_averages_them(corpus, tmp_path):
    from trained import checkpoints
    from trained.runs import load_trained
    logdir = tmp_path / "log"
    done = train(corpus, logdir, "--num_epochs", "3", "--average_every", "1", "--average_last", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    kept = checkpoints.snapshots(str(logdir))
    steps = [step for step, _ in kept]
    last_epoch = checkpoints.epoch_checkpoints(str(logdir))[-1][1]
    assert steps == [steps[-1] - 2, steps[-1] - 1, steps[-1]]  # the last three steps, the older ones pruned
    assert checkpoints.read_state(last_epoch)["step"] == steps[-1]
    hp = hyperparams.load_hparams(str(logdir))
    model, _, name = load_trained(hp)
    assert name.endswith("S%08d_avg3.keras" % steps[-1])
    each = [checkpoints.load(path, hp).get_weights() for _, path in kept]
    for mean, *weights in zip(model.get_weights(), *each):
        np.testing.assert_allclose(mean, np.mean(weights, axis=0), rtol=1e-6, atol=1e-7)
    for snapshot, epoch in zip(each[-1], checkpoints.load(last_epoch, hp).get_weights()):
        np.testing.assert_array_equal(snapshot, epoch)  # the newest snapshot is the run's last weights
    scored = run_script("eval.py", "--logdir", logdir, "--split", "test")
    assert scored.returncode == 0 and "_avg3" in scored.stdout, scored.stderr[-3000:]
    epochs = run_script("eval.py", "--logdir", logdir, "--split", "test", "--average_every", "0",
                        "--average_last", "2")
    assert epochs.returncode == 0 and "mean of the newest 2" in epochs.stdout, epochs.stderr[-3000:]
    wider = run_script("eval.py", "--logdir", logdir, "--split", "test", "--average_every", "2")
    assert_one_line_error(wider, r"--average_every 2 --average_last 3 averages snapshots at steps")


def test_pruning_keeps_the_newest_and_removes_nothing_while_there_are_fewer(tmp_path):
    from trained import checkpoints
    fake_run(tmp_path, [10, 11])
    steps = tmp_path / "ckpt" / "steps"
    steps.mkdir()
    for step in (10, 11):
        (steps / f"S{step:08d}.keras").write_bytes(b"")
    checkpoints.prune_snapshots(str(tmp_path), 3)  # once removed the older of two where three were asked
    checkpoints.prune_steps(str(tmp_path), 3)
    assert [s for s, _ in checkpoints.snapshots(str(tmp_path))] == [10, 11]
    assert len(checkpoints.step_checkpoints(str(tmp_path))) == 2
    checkpoints.prune_snapshots(str(tmp_path), 1)
    assert [s for s, _ in checkpoints.snapshots(str(tmp_path))] == [11]
