"""Train the Transformer German->English with label smoothing; a GPU is used when present.

    python train.py --preset sample
    python train.py --preset multi30k

After every epoch: dev loss, dev BLEU (greedy; all of dev or the first --eval_sentences), a
checkpoint <logdir>/ckpt/E<epoch>L<train loss>B<dev BLEU>.keras with the optimizer state, the dev
translations in <logdir>/eval/, TensorBoard scalars in <logdir>/tensorboard and one JSON line in
<logdir>/history.jsonl. Started again with the same --logdir, it resumes from the newest checkpoint.
"""
import dataclasses
import json
import os
import time

import numpy as np
from tqdm import tqdm

import data_load
import hyperparams
from eval import bleu_scores, checkpoints, format_scores, load_checkpoint, translate, write_results
from utils import UserError, atomic_write, run_cli, section


def progress_callback(epoch, num_epochs, tokens_per_step):
    """A Keras callback drawing one tqdm bar per epoch with loss, target tokens/s and learning rate."""
    import keras

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, _epoch, logs=None):
            self.bar = tqdm(total=len(tokens_per_step), desc=f"epoch {epoch + 1}/{num_epochs}",
                            unit="step", dynamic_ncols=True)
            self.start, self.tokens = time.time(), 0

        def on_train_batch_end(self, batch, logs=None):
            self.tokens += tokens_per_step[batch]
            self.bar.update(1)
            if batch % 10 == 0 or batch == len(tokens_per_step) - 1:
                lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
                self.bar.set_postfix(loss=f"{logs['loss']:.3f}",
                                     tok_s=f"{self.tokens / (time.time() - self.start):.0f}",
                                     lr=f"{lr:.2e}")

        def on_epoch_end(self, _epoch, logs=None):
            self.seconds = time.time() - self.start
            self.bar.close()

    return Progress()


def check_logdir(hp):
    """Refuse to mix runs: a logdir whose saved model settings differ from these."""
    path = os.path.join(hp.logdir, "hparams.json")
    if not os.path.isfile(path):
        return
    saved = hyperparams.load_hparams(hp.logdir)
    diff = [f"{f} {getattr(saved, f)} -> {getattr(hp, f)}" for f in hyperparams.MODEL_FIELDS + ("prepro_dir",)
            if getattr(saved, f) != getattr(hp, f)]
    if diff and checkpoints(hp.logdir):
        raise UserError(f"{path}: this logdir holds a run with other settings ({', '.join(diff)}); "
                        f"pass a new --logdir, or remove {hp.logdir} to start over")


def prune(logdir, keep):
    """Keep the newest `keep` epoch checkpoints."""
    for _, path in checkpoints(logdir)[:-keep]:
        os.remove(path)


def write_scalars(logdir, epoch, values):
    """Append one JSON line to history.jsonl and, on TensorFlow, TensorBoard scalars."""
    with open(os.path.join(logdir, "history.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"epoch": epoch, **values}) + "\n")
    try:
        import tensorflow as tf
    except ImportError:
        return
    writer = tf.summary.create_file_writer(os.path.join(logdir, "tensorboard"))
    with writer.as_default():
        for key, value in values.items():
            if isinstance(value, (int, float)):
                tf.summary.scalar(key, value, step=epoch)
    writer.close()


def main(argv=None):
    hp, _, _ = hyperparams.parse_args(__doc__.split("\n\n")[0], argv)
    import keras

    import model as transformer

    section("Settings")
    check_logdir(hp)
    print(json.dumps(dataclasses.asdict(hp), sort_keys=True))
    print(f"saved to {hyperparams.save_hparams(hp, hp.logdir)}")
    keras.utils.set_random_seed(hp.seed)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        gpus = tf.config.list_physical_devices("GPU")
        print(f"backend tensorflow, {'GPU: ' + ', '.join(g.name for g in gpus) if gpus else 'CPU'}")
    else:
        import jax
        print(f"backend {keras.backend.backend()}, devices {jax.devices()}")

    section("Load data")
    meta = data_load.load_meta(hp.prepro_dir)
    sp = data_load.load_vocab(hp.prepro_dir)
    train = data_load.TrainBatches(*data_load.load_split(hp.prepro_dir, "train"),
                                   hp.tokens_per_batch, hp.seed, hp.maxlen1, hp.maxlen2)
    print(f"train: {len(train)} pairs, {train.dropped} dropped as longer than maxlen1 {hp.maxlen1} / "
          f"maxlen2 {hp.maxlen2}")
    dev_src, dev_tgt = data_load.load_split(hp.prepro_dir, "dev")
    dev_refs = data_load.load_text(hp.prepro_dir, "dev", hp.tgt_lang)
    dev_sources = data_load.load_text(hp.prepro_dir, "dev", hp.src_lang)
    n_bleu = hp.eval_sentences or len(dev_src)
    dev_loss_batches = [data_load.training_arrays([dev_src[i] for i in idx], [dev_tgt[i] for i in idx])
                        for idx in data_load.eval_batches([max(len(s), len(t)) + 1 for s, t in zip(dev_src, dev_tgt)],
                                                          hp.tokens_per_batch, sort=True)]
    print(f"dev: {len(dev_src)} pairs, BLEU after each epoch on {n_bleu}")

    section("Build model")
    found = checkpoints(hp.logdir)
    if found:
        start_epoch, path = found[-1]
        model = load_checkpoint(path, hp)
        transformer.compile_model(model, hp)
        model.optimizer.build(model.trainable_variables)
        # load_checkpoint(compile=False) skips the optimizer: load it with the weights
        model.load_weights(path)
        print(f"resuming from {path}: epoch {start_epoch} done, step {int(model.optimizer.iterations.numpy())}")
    else:
        start_epoch = 0
        model = transformer.compile_model(transformer.make_model(hp, meta["vocab_size"]), hp)
    print(f"{model.count_params():,} parameters")
    if start_epoch >= hp.num_epochs:
        print(f"{hp.logdir} already holds {start_epoch} epochs (num_epochs {hp.num_epochs}): nothing to do")
        return

    section("Train")
    for epoch in range(start_epoch, hp.num_epochs):
        plan = train.plan(epoch)
        tokens = train.target_tokens(plan)
        dataset = data_load.tf_dataset(lambda: train.batches(plan), len(plan))
        progress = progress_callback(epoch, hp.num_epochs, tokens)
        history = model.fit(dataset, epochs=epoch + 1, initial_epoch=epoch, verbose=0, shuffle=False,
                            callbacks=[progress])
        train_loss = float(history.history["loss"][-1])
        if not np.isfinite(train_loss):
            raise UserError(f"training loss became {train_loss} in epoch {epoch + 1}: lower --lr or raise "
                            f"--warmup_steps; the last good checkpoint is kept in {hp.logdir}/ckpt")

        start = time.time()
        dev_loss = float(np.mean([model.test_on_batch(x, y) for x, y in dev_loss_batches]))
        hypotheses = translate(model, sp, dev_src[:n_bleu], hp.eval_tokens_per_batch, desc="dev BLEU")
        scores = bleu_scores(hypotheses, dev_refs[:n_bleu])
        eval_seconds = time.time() - start

        name = f"E{epoch + 1:02d}L{train_loss:.2f}B{scores['sacrebleu']:.2f}"
        write_results(os.path.join(hp.logdir, "eval", name + ".txt"), dev_sources[:n_bleu],
                      dev_refs[:n_bleu], hypotheses, format_scores(scores, "dev"))
        with atomic_write(os.path.join(hp.logdir, "ckpt", name + ".keras")) as tmp:
            model.save(tmp)
        prune(hp.logdir, hp.keep_checkpoints)
        lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        write_scalars(hp.logdir, epoch + 1, dict(
            train_loss=train_loss, dev_loss=dev_loss, dev_bleu=scores["sacrebleu"],
            dev_bleu_reference=scores["reference"], lr=lr, step=int(model.optimizer.iterations.numpy()),
            train_seconds=progress.seconds, eval_seconds=eval_seconds,
            tgt_tokens_per_s=sum(tokens) / progress.seconds))
        print(f"epoch {epoch + 1}: train loss {train_loss:.3f}, dev loss {dev_loss:.3f}, dev BLEU "
              f"{scores['sacrebleu']:.2f} (reference's way {scores['reference']:.2f}), "
              f"{sum(tokens) / progress.seconds:.0f} target tok/s, train {progress.seconds:.0f}s, "
              f"eval {eval_seconds:.0f}s -> {name}.keras", flush=True)
    print(f"done: checkpoints in {os.path.join(hp.logdir, 'ckpt')}, history in "
          f"{os.path.join(hp.logdir, 'history.jsonl')}")


if __name__ == "__main__":
    run_cli(main)
