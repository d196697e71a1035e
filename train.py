"""Train the Transformer on a prepro folder's language pair (German->English in the presets) with
label smoothing; a GPU is used when present.

    python train.py --preset sample
    python train.py --preset multi30k

After every epoch: dev loss (per target token), dev BLEU (greedy, whole sentences; all of dev or the first
--eval_sentences), a checkpoint <logdir>/ckpt/E<epoch>L<train loss>B<dev BLEU>.keras (B the
reference's way, multi-bleu.perl on raw text; the reference put it in its dev translation files'
names, iwslt2016_E19L2.64B28.06, not in its checkpoints'), the dev
translations in <logdir>/eval/ (<name>.txt: source / expected / got and both BLEUs; <name>: the
reference's layout, one translation a line and the multi-bleu line), TensorBoard scalars (every
step's loss and learning rate, every epoch's figures and three dev translations) in
<logdir>/tensorboard and one JSON line in <logdir>/history.jsonl; <logdir>/specs lists the weights.
Every --save_every_steps steps, and on SIGINT/SIGTERM, a mid-epoch checkpoint
<logdir>/ckpt/steps/S<step>.keras. With --average_every, snapshots of the last steps' weights in
<logdir>/ckpt/snapshots/S<step>.keras, which eval.py and the other scripts then average. Every
checkpoint holds the optimizer state, the position in the epoch and the random state. Started again
with the same command, training resumes from the newest checkpoint, as if it had never stopped.
"""
import dataclasses
import functools
import json
import os
import signal
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from trained import checkpoints
import data_load
from support import devices, records
import hyperparams
from trained.lines import translate_lines
from support.scoring import bleu_scores, format_scores, write_hypotheses, write_results
from support.utils import UserError, lock_directory, record_holder, run_cli, section


def progress_callback(epoch, num_epochs, first_batch, num_batches, tokens_per_step, guard):
    """A Keras callback drawing one tqdm bar per epoch with the epoch's loss so far (from `guard`,
    which must run before it), target tokens/s and learning rate.

    A resumed epoch starts its bar at first_batch; tokens_per_step covers the batches still to run.
    """
    import keras

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, _epoch, logs=None):
            self.bar = tqdm(total=num_batches, initial=first_batch, desc=f"epoch {epoch + 1}/{num_epochs}",
                            unit="step", dynamic_ncols=True, disable=None)  # no bar into a file
            self.start, self.tokens = time.time(), 0

        def on_train_batch_end(self, batch, logs=None):  # the guard has synced the variables
            self.tokens += tokens_per_step[batch]
            self.bar.update(1)
            if batch % 10 == 0 or batch == len(tokens_per_step) - 1:
                lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
                self.bar.set_postfix(loss=f"{guard.loss_total / max(guard.loss_count, 1e-9):.3f}",
                                     tok_s=f"{self.tokens / (time.time() - self.start):.0f}",
                                     lr=f"{lr:.2e}")

        def on_epoch_end(self, _epoch, logs=None):
            self.seconds = time.time() - self.start
            self.bar.close()


    return Progress()


class StopSignals:
    """While active, SIGINT and SIGTERM only set `received`; training saves a checkpoint and stops.

    A second signal of the same kind acts at once (the default action).
    """

    def __init__(self):
        self.received = None

    def __enter__(self):
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self.previous:
            signal.signal(s, self.handle)
        return self

    def handle(self, signum, _frame):
        self.received = signum
        signal.signal(signum, self.previous[signum])
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint, then stopping "
              f"(send it again to stop at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def guard_callback(hp, folder, epoch, first_batch, loss_total, loss_count, signals, total_steps=None):
    """A Keras callback that keeps the epoch's loss, writes mid-epoch checkpoints into the run's
    folder (hp.logdir, or a worker's scratch folder) every hp.save_every_steps steps and on
    SIGINT/SIGTERM, and stops at a non-finite loss (or counts
    and leaves out such a batch with hp.skip_nonfinite). With hp.average_every, it also keeps
    the snapshots to average: every hp.average_every steps of the last hp.average_last of them,
    up to step total_steps (the run's last).

    Keras' loss tracker is read and emptied after every batch, so that each batch's loss is the
    same float32 value whether or not the epoch was resumed midway; the epoch's sum is kept here,
    in float64, and saved with every mid-epoch checkpoint. (Differences of the tracker's running
    float32 sum would round differently in a resumed epoch.)"""
    import keras

    class Guard(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.tracker = next(m for m in self.model.metrics if m.name == "loss")
            self.loss_total, self.loss_count = loss_total, loss_count
            self.batch, self.nonfinite, self.saved, self.last_saved_step = first_batch, None, None, None

        def on_train_batch_end(self, batch, logs=None):
            devices.sync_variables(self.model)  # JAX: the next step reads the emptied tracker from them
            self.batch = first_batch + batch + 1
            batch_total = float(keras.ops.convert_to_numpy(self.tracker.total))  # this batch alone
            batch_count = float(keras.ops.convert_to_numpy(self.tracker.count))
            self.tracker.reset_state()
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.batch_loss = batch_total / max(batch_count, 1e-9)
            if np.isfinite(batch_total):
                self.loss_total += batch_total
                self.loss_count += batch_count
            elif not hp.skip_nonfinite:  # with it, the optimizer left the batch out: so does the loss
                self.nonfinite = (step, self.batch, batch_total / batch_count)
                self.model.stop_training = True
                return
            to_end = total_steps - step if hp.average_every and total_steps else -1
            if 0 <= to_end < hp.average_last * hp.average_every and to_end % hp.average_every == 0:
                checkpoints.save(self.model, checkpoints.snapshot_path(folder, step), self.state())
                checkpoints.prune_snapshots(folder, hp.average_last)
            due = hp.save_every_steps and step % hp.save_every_steps == 0 and step != self.last_saved_step
            if due or signals.received:
                self.save(step)
            if signals.received:
                self.model.stop_training = True

        def save(self, step):
            path = os.path.join(folder, "ckpt", "steps", f"S{step:08d}.keras")
            checkpoints.save(self.model, path, self.state())
            checkpoints.prune_steps(folder, hp.keep_step_checkpoints)
            self.saved, self.last_saved_step = path, step

        def state(self):
            return checkpoints.training_state(self.model, folder, epoch, self.batch, self.loss_total,
                                              self.loss_count)

    return Guard()


def step_scalars_callback(logdir, guard):
    """A Keras callback that writes every step's training loss and learning rate to TensorBoard
    (as the reference's training loop did), under step/; after the guard, which reads the loss.
    None where TensorFlow (which writes the event files) is not installed."""
    import keras
    try:
        import tensorflow as tf
    except ImportError:
        return None

    class StepScalars(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.writer = tf.summary.create_file_writer(os.path.join(logdir, "tensorboard"))

        def on_train_batch_end(self, batch, logs=None):
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            with self.writer.as_default(step=step):
                tf.summary.scalar("step/loss", guard.batch_loss)
                tf.summary.scalar("step/lr", lr)

        def on_train_end(self, logs=None):
            self.writer.close()

    return StepScalars()


def resume_changes(hp, given=()):
    """The settings hp changes in hp.logdir's run, {field: [saved value, hp's]}: only
    RESUMABLE_FIELDS may change; a UserError listing every other difference, since the run's
    weights were trained with its saved values. given: the fields set on the command line; a
    difference among the others comes from the preset (its values change between versions:
    CHANGELOG.md), and the error gives the options that resume the run as it was. Writes nothing."""
    saved = hyperparams.load_hparams(hp.logdir)
    path = os.path.join(hp.logdir, "hparams.json")
    diff = list(hyperparams.changed(saved, hp))
    fixed = [f for f in diff if f not in hyperparams.RESUMABLE_FIELDS]
    if fixed:
        dropped = [f"--{f}" for f in fixed if f in given]
        kept = [f"--{f} {getattr(saved, f)}" for f in fixed if f not in given]
        advice = ([f"drop {' '.join(dropped)}"] if dropped else []) + (
            [f"give {' '.join(kept)} (the --preset's own values differ: CHANGELOG.md)"] if kept else [])
        raise UserError(f"{path}: this run was trained with other settings ("
                        + ", ".join(f"{f} {getattr(saved, f)} -> {getattr(hp, f)}" for f in fixed)
                        + f"); a resumed run keeps them: {' and '.join(advice)}, or pass a new --logdir "
                        f"(or remove {hp.logdir}) to start over")
    if saved.lr_decay == "linear" and "num_epochs" in diff:
        # the line's slope is set by the run's length: another length would make the rate jump
        raise UserError(f"{path}: --num_epochs {hp.num_epochs}: this run's learning rate falls linearly to 0 at "
                        f"the end of its {saved.num_epochs} epochs (--lr_decay linear), and another length would "
                        f"make it jump; resume with --num_epochs {saved.num_epochs}, or train a new --logdir")
    return {f: [getattr(saved, f), getattr(hp, f)] for f in diff if f != "logdir"}


def check_start(hp, given=()):
    """What training in hp.logdir starts, checked before anything is written there: None for a new
    run; for a run with a checkpoint, (its step, the settings changed: resume_changes, given the
    fields set on the command line), once its data is checked (checkpoints.check_same_data)."""
    found = checkpoints.newest(hp.logdir)
    if not found:
        return None
    checkpoints.check_same_data(hp.logdir, hp.prepro_dir)
    return found[1].get("step", 0), resume_changes(hp, given)


def accept_start(hp, folder, resumed, lock):
    """Once the run is set to start or resume (check_start, the model built or restored), the first
    writes: the lock's holder, the settings (a new run's; a resumed run's changes, printed and
    recorded with their step in hparams.json) and the run's copy of the vocabulary
    (checkpoints.keep_vocabulary)."""
    record_holder(lock)
    if resumed is None:
        print(f"saved to {hyperparams.save_hparams(hp, folder)}")
    elif resumed[1]:
        step, changed = resumed
        print(f"resuming with changed settings from step {step}: "
              + ", ".join(f"{f} {a} -> {b}" for f, (a, b) in changed.items()))
        hyperparams.save_hparams(hp, folder, hyperparams.saved_changes(hp.logdir) + [{"step": step, **changed}])
    if not os.path.isfile(os.path.join(folder, checkpoints.VOCAB_DIR, "meta.json")):
        checkpoints.keep_vocabulary(hp.prepro_dir, folder)


def with_languages(hp, given):
    """hp with the source and target languages that prepro.py recorded in the prepro folder, so
    that --src_lang/--tgt_lang are given once, to prepro.py; saved in hparams.json, they reach
    eval.py and translate.py. Languages given here must be the folder's."""
    meta = data_load.load_meta(hp.prepro_dir)
    recorded = {"src_lang": meta.get("src_lang", hp.src_lang), "tgt_lang": meta.get("tgt_lang", hp.tgt_lang)}
    differ = [f"--{k} {given[k]} (the folder holds {v})" for k, v in recorded.items() if given.get(k, v) != v]
    if differ:
        raise UserError(f"{hp.prepro_dir} was made for {recorded['src_lang']}->{recorded['tgt_lang']}: "
                        f"{', '.join(differ)}; drop the language flags (prepro.py's are used) or run "
                        f"prepro.py for that pair into another --prepro_dir")
    return dataclasses.replace(hp, **recorded)


def write_specs(model, logdir):
    """<logdir>/specs, as the reference's save_variable_specs: the parameter count, then every
    weight's name and shape, one a line."""
    lines = [f"num_params: {model.count_params()}"] + [f"{w.path}==={tuple(w.shape)}" for w in model.weights]
    with open(os.path.join(logdir, "specs"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@functools.lru_cache(maxsize=None)
def code_commit():
    """The commit of the code this process runs (records.commit), read when training starts: a
    commit made while it trains is not its code."""
    return records.commit()


def peak_memory_mb():
    """The most memory this process has held so far (its peak resident set), in MB; None where the
    system does not say (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return round(peak / (2 ** 20 if sys.platform == "darwin" else 2 ** 10), 1)


def write_scalars(logdir, epoch, values, samples=()):
    """Append one JSON line to history.jsonl; TensorBoard scalars for the epoch and, as the
    reference's evaluation did, a few dev translations as text (samples: (source, translation,
    reference) triples). TensorBoard only where TensorFlow is installed."""
    with open(os.path.join(logdir, "history.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"epoch": epoch, **values}) + "\n")
    try:
        import tensorflow as tf
    except ImportError:
        return
    writer = tf.summary.create_file_writer(os.path.join(logdir, "tensorboard"))
    with writer.as_default(step=epoch):
        for key, value in values.items():
            if isinstance(value, (int, float)):
                tf.summary.scalar(key, value)
        for i, (source, got, expected) in enumerate(samples):
            tf.summary.text(f"dev/{i}", f"source: {source}\n\ntranslation: {got}\n\nreference: {expected}")
    writer.close()


# history.png is redrawn after an epoch once this long has passed since the last drawing, and after
# the last epoch: every epoch of a real run, while a run of sub-second epochs (the sample) does not
# spend most of its time drawing (a drawing takes about 0.7 s on a 2-core CPU).
REDRAW_SECONDS = 30.0


def draw_history(logdir):
    """<logdir>/history.png from history.jsonl (support/pictures.py)."""
    from support import pictures

    try:
        pictures.plot_history(pictures.read_history(os.path.join(logdir, "history.jsonl")),
                              os.path.join(logdir, "history.png"))
    except ImportError as e:  # matplotlib is a requirement, but a picture is not worth a stopped run
        print(f"note: history.png not drawn ({e})", file=sys.stderr)


@dataclasses.dataclass
class Dev:
    """The dev split as training uses it: loss batches, and the sentences translated for BLEU."""
    loss_batches: list
    sources: list
    references: list


def load_data(hp, run):
    """(training batches, vocabulary size, sentencepiece processor, Dev, the run's total steps where
    a linear decay or --average_every needs them or None), with what they hold printed."""
    meta = data_load.load_meta(hp.prepro_dir)
    sp = data_load.load_vocab(hp.prepro_dir)
    resegment, extra_target_ids = None, ()
    if hp.subword_sampling:
        texts = [data_load.load_text(hp.prepro_dir, "train", lang) for lang in (hp.src_lang, hp.tgt_lang)]
        resegment = data_load.resegmenter(sp, *texts, hp.subword_sampling, hp.seed)
        extra_target_ids = data_load.pieces_within(sp, texts[1])
    train = data_load.TrainBatches(*data_load.load_split(hp.prepro_dir, "train"),
                                   hp.tokens_per_batch, hp.seed, hp.maxlen1, hp.maxlen2,
                                   run.length_multiple, hp.batch_sentences, resegment, extra_target_ids,
                                   run.length_buckets)
    if resegment is not None:
        print(f"subword sampling: every epoch's training text segmented anew, each BPE merge skipped with "
              f"probability {hp.subword_sampling} (the pairs and batches below: epoch 1's)")
    print(f"train: {len(train)} pairs, {train.dropped} dropped as longer than maxlen1 {hp.maxlen1} / "
          f"maxlen2 {hp.maxlen2}; {len(train.plan(0))} batches an epoch in {len(train.shapes(train.plan(0)))} "
          f"distinct shapes" + (" (one XLA compilation each)" if run.jit_compile else "")
          + f", {train.padding(train.plan(0)):.1%} of their tokens padding")
    # The linear decay ends after the steps of all epochs, and the snapshots to average are their last
    # ones; each epoch's batches are fixed by the seed.
    needed = hp.lr_decay == "linear" or hp.average_every
    total_steps = sum(len(train.plan(e)) for e in range(hp.num_epochs)) if needed else None
    if hp.lr_decay == "linear":
        print(f"learning rate: warmup over {hp.warmup_steps} steps, then down to 0 at step {total_steps}")
        if hp.warmup_steps >= total_steps:
            print(f"note: --warmup_steps {hp.warmup_steps} is not shorter than the run ({total_steps} steps): the "
                  f"learning rate rises all the way and never decays; lower --warmup_steps (a tenth of the "
                  f"steps is common) or raise --num_epochs", file=sys.stderr)
    dev_src, dev_tgt = data_load.load_split(hp.prepro_dir, "dev")
    n_bleu = hp.eval_sentences or len(dev_src)
    dev = Dev(data_load.loss_batches(dev_src, dev_tgt, hp.tokens_per_batch, hp.maxlen1, hp.maxlen2),
              data_load.load_text(hp.prepro_dir, "dev", hp.src_lang)[:n_bleu],
              data_load.load_text(hp.prepro_dir, "dev", hp.tgt_lang)[:n_bleu])
    print(f"dev: {len(dev_src)} pairs, BLEU after each epoch on {n_bleu}")
    if not dev.loss_batches:
        print(f"note: no dev pair fits maxlen1 {hp.maxlen1} / maxlen2 {hp.maxlen2}: the dev loss is not measured "
              f"(nan); BLEU translates every dev sentence", file=sys.stderr)
    return train, meta["vocab_size"], sp, dev, total_steps


def build_or_resume(hp, run, train, vocab_size, total_steps):
    """The model, compiled: restored from the newest checkpoint of hp.logdir, or new. Returns
    (model, first epoch, first batch of it, (loss total, token count) carried into it)."""
    import keras

    import model as transformer

    found = checkpoints.newest(hp.logdir)
    if not found:
        with run.scope:
            output_ids = data_load.output_ids(hp.output_vocab, train.target_ids())
            model = transformer.compile_model(transformer.make_model(hp, vocab_size, output_ids), hp, total_steps)
        return model, 0, 0, (0.0, 0.0)
    path, state = found
    with run.scope:
        model = checkpoints.restore(path, state, hp, total_steps)
    epoch, batch = state["epoch"], state["batch"]
    step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    where = (f"epoch {epoch} done" if batch == 0 else
             f"epoch {epoch + 1}, batch {batch} of {len(train.plan(epoch))}")
    print(f"resuming from {path}: {where}, step {step}")
    return model, epoch, batch, (state.get("loss_total", 0.0), state.get("loss_count", 0.0))


@dataclasses.dataclass
class Fitted:
    """What fit_epoch hands to end_epoch."""
    guard: object  # guard_callback's: the epoch's loss, its last batch
    progress: object  # progress_callback's: the seconds the steps took
    tokens: list  # the target tokens of each batch trained on
    fit_seconds: float  # the epoch's steps plus Keras' set-up and tear-down


def fit_epoch(model, hp, folder, train, epoch, first, carry, signals, total_steps=None):
    """Train on the batches of `epoch` from batch `first` on, checkpoints into folder; stop the run
    (UserError, or exit on a signal) where the guard says so. total_steps: the run's steps, where
    load_data counted them. Returns a Fitted."""
    plan = train.plan(epoch)
    rest = plan[first:]
    tokens = train.target_tokens(rest)
    guard = guard_callback(hp, folder, epoch, first, *carry, signals, total_steps)
    progress = progress_callback(epoch, hp.num_epochs, first, len(plan), tokens, guard)
    fit_start = time.time()
    if rest:
        if devices.backend() == "tensorflow":
            dataset = data_load.tf_dataset(lambda: train.batches(rest), len(rest))
        else:  # NumPy batches: no TensorFlow needed
            dataset = train.batches(rest)
        # the number of steps given: Keras cannot know a generator's length, and warns that the input
        # ran out of data when it ends
        model.fit(dataset, steps_per_epoch=len(rest), epochs=epoch + 1, initial_epoch=epoch, verbose=0, shuffle=False,
                  callbacks=[c for c in (guard, step_scalars_callback(folder, guard), progress) if c])
    fit_seconds = time.time() - fit_start  # the epoch's steps plus Keras' set-up and tear-down
    if guard.nonfinite:
        step, batch, value = guard.nonfinite
        last = checkpoints.newest(hp.logdir)
        raise UserError(f"training loss became {value} at step {step} (epoch {epoch + 1}, batch {batch}); "
                        f"the last good checkpoint, {last[0] if last else 'none yet'}, is untouched; "
                        f"lower --lr or raise --warmup_steps, or pass --skip_nonfinite 1 to leave such "
                        f"batches out")
    if signals.received and guard.batch < len(plan):
        print(f"stopped by {signal.Signals(signals.received).name} in epoch {epoch + 1} at batch "
              f"{guard.batch} of {len(plan)}: saved {guard.saved}; run the same command to resume")
        sys.exit(128 + signals.received)
    if not rest:
        progress.seconds = 0.0
    return Fitted(guard, progress, tokens, fit_seconds)


def end_epoch(model, hp, folder, sp, dev, epoch, fitted, started):
    """After an epoch (fitted: fit_epoch's): dev loss and BLEU, the dev translations, the epoch
    checkpoint, the history line and TensorBoard scalars in folder, one printed line. Returns the
    checkpoint's name."""
    import keras

    import model as transformer

    guard, progress, tokens = fitted.guard, fitted.progress, fitted.tokens
    train_loss = guard.loss_total / guard.loss_count if guard.loss_count else float("nan")
    skipped = int(keras.ops.convert_to_numpy(getattr(model.optimizer, "skipped_steps", 0)))
    start = time.time()
    dev_loss = transformer.loss_per_token(model, dev.loss_batches)
    hypotheses = translate_lines(model, sp, dev.sources, hp.maxlen1, hp.eval_tokens_per_batch, desc="dev BLEU",
                                 source=os.path.join(hp.prepro_dir, f"dev.{hp.src_lang}"), whole=True)
    scores = bleu_scores(hypotheses, dev.references, hp.tgt_lang)
    eval_seconds = time.time() - start

    # Named as the reference names its dev translation files (its checkpoints carried no BLEU):
    # E<epoch>L<training loss>B<dev BLEU the multi-bleu.perl way>, comparable with its
    # iwslt2016_E19L2.64B28.06.
    name = f"E{epoch + 1:02d}L{train_loss:.2f}B{scores['reference']:.2f}"
    start = time.time()
    write_results(os.path.join(folder, "eval", name + ".txt"), dev.sources, dev.references, hypotheses,
                  format_scores(scores, "dev"))
    write_hypotheses(os.path.join(folder, "eval", name), hypotheses, scores["reference_report"])
    checkpoints.save(model, os.path.join(folder, "ckpt", name + ".keras"),
                     checkpoints.training_state(model, folder, epoch + 1, 0, 0.0, 0.0))
    checkpoints.prune(folder, hp.keep_checkpoints)
    checkpoints.prune_steps(folder)  # older than the epoch checkpoint
    save_seconds = time.time() - start
    lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    seconds = max(progress.seconds, 1e-9)
    write_scalars(folder, epoch + 1, dict(
        train_loss=train_loss, dev_loss=dev_loss, dev_bleu=scores["sacrebleu"],
        dev_bleu_reference=scores["reference"], lr=lr,
        step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)), skipped_batches=skipped,
        train_seconds=progress.seconds, fit_seconds=fitted.fit_seconds, eval_seconds=eval_seconds,
        save_seconds=save_seconds, elapsed_seconds=time.time() - started, tgt_tokens_per_s=sum(tokens) / seconds,
        precision=keras.mixed_precision.global_policy().name, peak_memory_mb=peak_memory_mb(), commit=code_commit()),
        samples=list(zip(dev.sources, hypotheses, dev.references))[:3])
    print(f"epoch {epoch + 1}: train loss {train_loss:.3f}, dev loss {dev_loss:.3f}, dev BLEU "
          f"{scores['sacrebleu']:.2f} (reference's way {scores['reference']:.2f}), "
          f"{sum(tokens) / seconds:.0f} target tok/s, train {progress.seconds:.0f}s, "
          f"eval {eval_seconds:.0f}s" + (f", {skipped} non-finite batches left out so far" if skipped else "")
          + f" -> {name}.keras", flush=True)
    return name


# The settings train.py uses (--help shows these): all but prepro.py's, which the prepro folder fixes.
SETTINGS = ("prepro_dir", "src_lang", "tgt_lang", "model", "training", "devices", "evaluation", "run")


def main(argv=None):
    started = time.time()
    code_commit()
    hp, _, given = hyperparams.parse_args(
        __doc__.split("\n\n")[0], argv, show=SETTINGS,
        unread="they are prepro.py's: training reads the vocabulary and ids of --prepro_dir; drop them "
               "here, or run prepro.py with them first")
    import keras

    section("Settings")
    run = devices.setup(hp)  # first: a multi-worker strategy must exist before other TensorFlow work
    print(run.describe())
    if hp.skip_nonfinite and devices.backend() != "tensorflow":
        raise UserError("--skip_nonfinite 1 (model.SkipNonfinite) works with KERAS_BACKEND=tensorflow only")
    # In a multi-worker run every worker reads hp.logdir (shared storage) and only the chief
    # writes there; the others write into a scratch directory.
    logdir = hp.logdir if run.chief else tempfile.mkdtemp(prefix="transformer-worker-")
    lock = lock_directory(logdir, record=False)  # held until the process ends
    hp = with_languages(hp, given)
    print(json.dumps(dataclasses.asdict(hp), sort_keys=True))
    resumed = check_start(hp, given)  # nothing is written into the run's folder before it is accepted
    keras.utils.set_random_seed(hp.seed)

    section("Load data")
    train, vocab_size, sp, dev, total_steps = load_data(hp, run)

    section("Build model")
    model, start_epoch, start_batch, carry = build_or_resume(hp, run, train, vocab_size, total_steps)
    accept_start(hp, logdir, resumed, lock)
    print(f"{model.count_params():,} parameters; softmax over {model.output_size:,} of {model.vocab_size:,} ids "
          f"(--output_vocab {model.output_vocab})")
    write_specs(model, logdir)
    if start_epoch >= hp.num_epochs:
        print(f"{hp.logdir} already holds {start_epoch} epochs (num_epochs {hp.num_epochs}): nothing to do")
        return

    section("Train")
    drawn = -REDRAW_SECONDS  # when history.png was last drawn (time.monotonic)
    with StopSignals() as signals:
        for epoch in range(start_epoch, hp.num_epochs):
            resumed = epoch == start_epoch
            fitted = fit_epoch(model, hp, logdir, train, epoch, start_batch if resumed else 0,
                               carry if resumed else (0.0, 0.0), signals, total_steps)
            name = end_epoch(model, hp, logdir, sp, dev, epoch, fitted, started)
            if epoch + 1 == hp.num_epochs or signals.received or time.monotonic() - drawn >= REDRAW_SECONDS:
                draw_history(logdir)
                drawn = time.monotonic()
            if signals.received:
                print(f"stopped by {signal.Signals(signals.received).name} after epoch {epoch + 1}: saved "
                      f"{name}.keras; run the same command to resume")
                sys.exit(128 + signals.received)
    print(f"done: checkpoints in {os.path.join(hp.logdir, 'ckpt')}, history in "
          f"{os.path.join(hp.logdir, 'history.jsonl')} (drawn in history.png)")


if __name__ == "__main__":
    run_cli(main)
