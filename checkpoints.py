"""Checkpoints: save, list, find the newest, load, restore for training, prune and average.

A checkpoint is a .keras file (the model's config, weights and optimizer state) holding, inside the
same zip, `training_state.json`: where training was (epoch, batch, step), the dropout layers' random
state and the epoch's loss so far, so that a resumed run continues exactly as if never stopped.
Each is written under a temporary name and renamed once complete: a run killed at any moment leaves
only whole checkpoints.

    <logdir>/ckpt/E<epoch>L<train loss>B<dev BLEU>.keras   after every epoch (the reference's naming)
    <logdir>/ckpt/steps/S<step>.keras                      mid-epoch, every --save_every_steps
"""
import json
import os
import re
import sys
import zipfile

import numpy as np

import hyperparams
from utils import UserError, atomic_write

EPOCH_CHECKPOINT = re.compile(r"^E(\d+)L([\d.]+|nan|inf)B([\d.]+)\.keras$")
STEP_CHECKPOINT = re.compile(r"^S(\d+)\.keras$")
STATE_FILE = "training_state.json"


# Finding them

def _numbered(directory, pattern):
    """(number, path) of the files in directory whose names match pattern, by number."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(directory) if (m := pattern.match(name))]
    return [(number, os.path.join(directory, name)) for number, name in sorted(found)]


def epoch_checkpoints(logdir):
    """Epoch checkpoints of <logdir>/ckpt as (epoch, path), oldest first."""
    return _numbered(os.path.join(logdir, "ckpt"), EPOCH_CHECKPOINT)


def step_checkpoints(logdir):
    """Paths of the mid-epoch checkpoints of <logdir>/ckpt/steps, oldest first."""
    return [path for _, path in _numbered(os.path.join(logdir, "ckpt", "steps"), STEP_CHECKPOINT)]


def read_state(path):
    """The training state inside a checkpoint; None for a checkpoint without one."""
    with zipfile.ZipFile(path) as z:
        if STATE_FILE not in z.namelist():
            return None
        return json.loads(z.read(STATE_FILE))


def newest(logdir):
    """(path, state) of the checkpoint to resume from, the latest position in training; None if none.

    The state of an epoch checkpoint is {epoch: epochs done, batch: 0}; of a mid-epoch one
    {epoch: epoch in progress (0-based), batch: batches of it done}. A file that cannot be read is
    passed over with a note.
    """
    candidates = [(path, {"epoch": epoch, "batch": 0}) for epoch, path in epoch_checkpoints(logdir)]
    candidates += [(path, None) for path in step_checkpoints(logdir)]
    best = None
    for path, fallback in candidates:
        try:
            state = read_state(path) or fallback
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            print(f"note: {path}: not a readable checkpoint ({e}); passed over", file=sys.stderr)
            continue
        if state is None:
            continue
        if best is None or (state["epoch"], state["batch"]) > (best[1]["epoch"], best[1]["batch"]):
            best = (path, state)
    return best


# Saving

def seed_states(model):
    """The state variables of the dropout layers' random seed generators (not among .keras weights)."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def training_state(model, epoch, batch, loss_total, loss_count):
    """What a checkpoint needs besides weights and optimizer to continue exactly where it was."""
    import keras

    return dict(epoch=epoch, batch=batch, step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                rng=[keras.ops.convert_to_numpy(v).tolist() for v in seed_states(model)],
                loss_total=loss_total, loss_count=loss_count)


def save(model, path, state):
    """model.save plus the training state in the same zip, renamed into place once complete."""
    import devices

    devices.sync_variables(model)
    with atomic_write(path) as tmp:
        model.save(tmp)
        with zipfile.ZipFile(tmp, "a") as z:
            z.writestr(STATE_FILE, json.dumps(state))


def prune(logdir, keep):
    """Keep the newest `keep` epoch checkpoints."""
    for _, path in epoch_checkpoints(logdir)[:-keep]:
        os.remove(path)


def prune_steps(logdir, keep=0):
    """Keep the newest `keep` mid-epoch checkpoints (none: an epoch checkpoint supersedes them)."""
    paths = step_checkpoints(logdir)
    for path in paths[:len(paths) - keep]:
        os.remove(path)


# Loading

def load(path, hp):
    """The model of a .keras checkpoint written by train.py, uncompiled; a UserError if it is
    missing, damaged, or of other settings than hp's."""
    import keras

    import fast
    import model as _model  # noqa: F401  (registers the model's classes for deserialization)

    if not os.path.isfile(path):
        raise UserError(f"{path}: checkpoint not found")
    fast.use(hp.kernels)  # before the layers are constructed
    try:
        m = keras.models.load_model(path, compile=False)
    except Exception as e:  # Keras raises many types for a damaged or foreign file
        raise UserError(f"{path}: cannot load this checkpoint ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        f"is it a complete .keras file written by train.py?") from None
    wanted = {f: getattr(hp, f) for f in hyperparams.MODEL_FIELDS}
    got = {f: getattr(m, f) for f in hyperparams.MODEL_FIELDS}
    if wanted != got:
        diff = ", ".join(f"{f} {got[f]} (settings say {wanted[f]})" for f in wanted if wanted[f] != got[f])
        raise UserError(f"{path}: checkpoint of a different model: {diff}; use the --logdir it was "
                        f"trained in, or drop the overrides")
    return m


def restore(path, state, hp, total_steps=None):
    """The model of a checkpoint, compiled, with its optimizer state and random state: training
    continues from it exactly."""
    import keras

    import model as transformer

    m = load(path, hp)
    transformer.compile_model(m, hp, total_steps)  # builds the optimizer
    m.load_weights(path)  # load(compile=False) skipped the optimizer's state: this loads it too
    for variable, value in zip(seed_states(m), state.get("rng") or []):
        variable.assign(np.asarray(value, dtype=keras.backend.standardize_dtype(variable.dtype)))
    return m


def average(paths, hp):
    """The model of the last of paths, with the element-wise mean of all their weights."""
    m = load(paths[-1], hp)
    total = [np.zeros_like(w, dtype=np.float64) for w in m.get_weights()]
    for path in paths:
        for acc, w in zip(total, load(path, hp).get_weights()):
            acc += w
    m.set_weights([(acc / len(paths)).astype(w.dtype) for acc, w in zip(total, m.get_weights())])
    return m
