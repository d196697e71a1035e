"""Checkpoints: save, list, find the newest, load, restore for training, prune and average.

A checkpoint is a .keras file (the model's config, weights and optimizer state) holding, inside the
same zip, `training_state.json`: where training was (epoch, batch, step), the dropout layers' random
state and the epoch's loss so far, so that a resumed run continues exactly as if never stopped.
Each is written under a temporary name and renamed once complete: a run killed at any moment leaves
only whole checkpoints.

    <logdir>/ckpt/E<epoch>L<train loss>B<dev BLEU>.keras   after every epoch (the name of the reference's
                                                           dev translation files; its checkpoints had no B)
    <logdir>/ckpt/steps/S<step>.keras                      mid-epoch, every --save_every_steps
    <logdir>/ckpt/snapshots/S<step>.keras                  the weights to average, every --average_every
                                                           steps of the run's last ones
    <logdir>/vocab/{bpe.model,meta.json}                   the run's copy of its vocabulary

The log directory is the trained model: with its vocabulary copy, eval.py and translate.py need no
prepro folder's sentencepiece model, and every checkpoint records the checksum of the vocabulary
it was trained with.
"""
import json
import os
import re
import sys
import zipfile

import numpy as np

import data_load
import hyperparams
from support.utils import UserError, atomic_write, import_keras, quiet_half_precision

EPOCH_CHECKPOINT = re.compile(r"^E(\d+)L([\d.]+|nan|inf)B([\d.]+)\.keras$")
STEP_CHECKPOINT = re.compile(r"^S(\d+)\.keras$")
STATE_FILE = "training_state.json"
VOCAB_DIR = "vocab"
# meta.json entries that say which data a prepro folder holds (the others describe it)
DATA_KEYS = ("bpe_sha256", "vocab_size", "pairs", "src_lang", "tgt_lang", "corpus", "data_dir")


# The vocabulary: the run's own copy

def keep_vocabulary(prepro_dir, logdir):
    """Copy prepro_dir's sentencepiece model and meta.json into <logdir>/vocab (checked first)."""
    data_load.load_vocab(prepro_dir)  # the model is the one that wrote the ids
    for name in ("bpe.model", "meta.json"):
        with open(os.path.join(prepro_dir, name), "rb") as f:
            data = f.read()
        with atomic_write(os.path.join(logdir, VOCAB_DIR, name)) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)


def vocabulary(logdir, prepro_dir):
    """(sentencepiece processor, its meta) of a trained run: <logdir>/vocab, or for a run from
    before that copy existed, prepro_dir's."""
    own = os.path.join(logdir, VOCAB_DIR)
    where = own if os.path.isfile(os.path.join(own, "meta.json")) else prepro_dir
    return data_load.load_vocab(where), data_load.load_meta(where)


def own_meta(logdir):
    """(path, contents) of the meta.json of the run's copy of its vocabulary; contents None for a
    run from before that copy existed, or a worker's scratch directory."""
    path = os.path.join(logdir, VOCAB_DIR, "meta.json")
    if not os.path.isfile(path):
        return path, None
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


def check_same_data(logdir, prepro_dir):
    """A UserError unless prepro_dir holds the data the run in logdir started on (by its meta.json
    and vocabulary checksum); quiet for a run from before <logdir>/vocab existed."""
    path, then = own_meta(logdir)
    if then is None:
        return
    now = data_load.load_meta(prepro_dir)
    changed = [key for key in DATA_KEYS if then.get(key) != now.get(key)]
    if changed:
        raise UserError(f"{prepro_dir} no longer holds the data this run started on ({', '.join(changed)} "
                        f"differ from {path}); run prepro.py again as before, pass the --prepro_dir it "
                        f"trained on, or start a new --logdir")


def check_vocabulary(logdir, prepro_dir):
    """A UserError if prepro_dir holds another vocabulary than the run in logdir (by checksum), so
    that its id files mean what the model learned; quiet for a run from before <logdir>/vocab and
    for a prepro_dir that holds none (translate.py needs none; eval.py says so when it reads)."""
    path, own = own_meta(logdir)
    if own is None or not os.path.isfile(os.path.join(prepro_dir, "meta.json")):
        return
    if data_load.load_meta(prepro_dir).get("bpe_sha256") != own.get("bpe_sha256"):
        raise UserError(f"{prepro_dir} holds another vocabulary than the run in {logdir} (its bpe.model checksum "
                        f"differs from {path}): pass the --prepro_dir the run was trained on, or none")


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


def snapshots(logdir):
    """(step, path) of the snapshots of <logdir>/ckpt/snapshots (--average_every), oldest first."""
    return _numbered(os.path.join(logdir, "ckpt", "snapshots"), STEP_CHECKPOINT)


def snapshot_path(logdir, step):
    return os.path.join(logdir, "ckpt", "snapshots", f"S{step:08d}.keras")


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


def training_state(model, logdir, epoch, batch, loss_total, loss_count):
    """What a checkpoint needs besides weights and optimizer to continue exactly where it was, and
    the checksum of the vocabulary it is trained with (<logdir>/vocab)."""
    import keras

    bpe_sha256 = (own_meta(logdir)[1] or {}).get("bpe_sha256")  # None in a worker's scratch directory
    skipped = getattr(model.optimizer, "skipped_steps", None)  # model.SkipNonfinite's count
    return dict(epoch=epoch, batch=batch, step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                rng=[keras.ops.convert_to_numpy(v).tolist() for v in seed_states(model)],
                loss_total=loss_total, loss_count=loss_count, bpe_sha256=bpe_sha256,
                skipped=0 if skipped is None else int(keras.ops.convert_to_numpy(skipped)))


def save(model, path, state):
    """model.save plus the training state in the same zip, renamed into place once complete."""
    from support import devices

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
    _keep_newest(step_checkpoints(logdir), keep)


def prune_snapshots(logdir, keep):
    """Keep the newest `keep` snapshots."""
    _keep_newest([path for _, path in snapshots(logdir)], keep)


def _keep_newest(paths, keep):
    for path in paths[:max(len(paths) - keep, 0)]:  # not paths[:-1] where fewer than keep
        os.remove(path)


# Loading

def load(path, hp, vocabulary_meta=None, dtype=None):
    """The model of a .keras checkpoint written by train.py, uncompiled, built with hp.kernels'
    parts and decoding as hp.jit_compile says (whatever it was trained with), every layer in the
    dtype policy dtype (None: the one it was trained in); a UserError if it is missing, damaged, of
    other settings than hp's, or trained with another vocabulary than vocabulary_meta's (the
    meta.json of the vocabulary it is to be used with)."""
    keras = import_keras()  # the first import of Keras in eval.py and translate.py: quietly

    import model as transformer
    from support import devices

    if not os.path.isfile(path):
        raise UserError(f"{path}: checkpoint not found")
    try:
        with zipfile.ZipFile(path) as z:
            config = json.loads(z.read("config.json"))
        config["config"]["kernels"] = hp.kernels
        config["config"]["xla_decoding"] = devices.jit_compile(hp)
        if dtype is not None:
            config["config"]["dtype"] = dtype
        config.pop("compile_config", None)  # uncompiled, as load_model(compile=False)
        if "mixed_float16" in json.dumps(config["config"].get("dtype")) and keras.backend.backend() == "tensorflow":
            quiet_half_precision()  # trained in float16: its layers are made in it
        objects = {"Transformer": transformer.Transformer}
        m = keras.saving.deserialize_keras_object(config, custom_objects=objects)  # built (its build_config)
        m.load_weights(path)
    except Exception as e:  # Keras raises many types for a damaged or foreign file
        raise UserError(f"{path}: cannot load this checkpoint ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        f"is it a complete .keras file written by train.py?") from None
    vocabulary_meta = vocabulary_meta or {}
    trained_with = (read_state(path) or {}).get("bpe_sha256")
    if trained_with and vocabulary_meta.get("bpe_sha256") not in (None, trained_with):
        raise UserError(f"{path}: trained with another vocabulary than the run's own ({VOCAB_DIR}/bpe.model "
                        f"checksum differs); use the checkpoint with the log directory it was trained in")
    wanted = {f: getattr(hp, f) for f in hyperparams.MODEL_FIELDS}
    got = {f: m.setting(f) for f in hyperparams.MODEL_FIELDS}
    if wanted != got:
        diff = ", ".join(f"{f} {got[f]} (settings say {wanted[f]})" for f in wanted if wanted[f] != got[f])
        raise UserError(f"{path}: checkpoint of a different model: {diff}; use the --logdir it was "
                        f"trained in, or drop the overrides")
    return m


def trained_precision(path):
    """The name of the dtype policy the checkpoint at path was trained in."""
    import keras

    with zipfile.ZipFile(path) as z:
        dtype = json.loads(z.read("config.json"))["config"].get("dtype")
    return keras.dtype_policies.get(dtype).name if dtype else "float32"


def restore(path, state, hp, total_steps=None):
    """The model of a checkpoint, compiled, with its optimizer state and random state: training
    continues from it exactly."""
    import keras

    import model as transformer

    now = keras.config.dtype_policy().name  # the precision training was set up in
    then = trained_precision(path)
    if (then == "mixed_float16") != (now == "mixed_float16"):  # Keras wraps the optimizer for float16
        raise UserError(f"{path}: trained in {then}, which cannot go on in {now}: mixed_float16 keeps a loss "
                        f"scale in the optimizer's state and the other precisions do not; resume with "
                        f"--precision {then}, or start a new --logdir")
    m = load(path, hp, dtype=now)
    transformer.compile_model(m, hp, total_steps)  # builds the optimizer
    m.load_weights(path)  # load(compile=False) skipped the optimizer's state: this loads it too
    step = int(keras.ops.convert_to_numpy(m.optimizer.iterations))
    if "step" in state and step != state["step"]:  # Keras only warns when it cannot load the state
        raise UserError(f"{path}: its optimizer state (step {state['step']}) does not load into the optimizer of "
                        f"these settings; resume with the settings it was saved with (hparams.json), or "
                        f"start a new --logdir")
    if getattr(m.optimizer, "skipped_steps", None) is not None and "skipped" in state:
        m.optimizer.skipped_steps.assign(state["skipped"])
    for variable, value in zip(seed_states(m), state.get("rng") or []):
        variable.assign(np.asarray(value, dtype=keras.backend.standardize_dtype(variable.dtype)))
    return m


def average(paths, hp, vocabulary_meta=None, dtype=None):
    """The model of the last of paths, with the element-wise mean of all their weights (dtype as
    load's)."""
    m = load(paths[-1], hp, vocabulary_meta, dtype)
    total = [np.zeros_like(w, dtype=np.float64) for w in m.get_weights()]
    for path in paths:
        for acc, w in zip(total, load(path, hp, vocabulary_meta, dtype).get_weights()):
            acc += w
    m.set_weights([(acc / len(paths)).astype(w.dtype) for acc, w in zip(total, m.get_weights())])
    return m
