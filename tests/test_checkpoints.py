"""Finding, choosing and pruning checkpoints by name and training state (no model needed: the files
are zips holding only the state); a run trained before the layout change translating the same after
it. Saving, restoring and averaging real checkpoints are tested by test_train.py (bit-for-bit
resume) and test_eval.py (--average_last)."""
import json
import os
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT
from trained import checkpoints


def fake_checkpoint(path, state=None):
    """A zip under a checkpoint's name, holding the training state only (or nothing)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
        if state is not None:
            z.writestr(checkpoints.STATE_FILE, json.dumps(state))
    return str(path)


def test_listing_orders_by_number_and_ignores_other_files(tmp_path):
    ckpt = tmp_path / "ckpt"
    for name in ("E10L2.00B30.00.keras", "E9L2.10B29.00.keras", "E02LnanB0.00.keras", "notes.txt",
                 ".tmp-123-E11L1.90B31.00.keras"):
        fake_checkpoint(ckpt / name)
    for name in ("S00000100.keras", "S00000020.keras", "S7.keras.bak"):
        fake_checkpoint(ckpt / "steps" / name)
    assert [(e, os.path.basename(p)) for e, p in checkpoints.epoch_checkpoints(str(tmp_path))] == [
        (2, "E02LnanB0.00.keras"), (9, "E9L2.10B29.00.keras"), (10, "E10L2.00B30.00.keras")]
    assert [os.path.basename(p) for p in checkpoints.step_checkpoints(str(tmp_path))] == [
        "S00000020.keras", "S00000100.keras"]
    assert checkpoints.epoch_checkpoints(str(tmp_path / "none")) == []


def test_newest_is_the_latest_position_in_training_and_skips_unreadable_files(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    fake_checkpoint(ckpt / "E01L4.00B1.00.keras", {"epoch": 1, "batch": 0})
    fake_checkpoint(ckpt / "E02L3.00B2.00.keras")  # written before states existed: epoch 2 done
    step = fake_checkpoint(ckpt / "steps" / "S00000050.keras", {"epoch": 2, "batch": 6})  # epoch 3, batch 6
    older = fake_checkpoint(ckpt / "steps" / "S00000045.keras", {"epoch": 2, "batch": 1})
    fake_checkpoint(ckpt / "steps" / "S00000040.keras", {"epoch": 1, "batch": 20})  # not yet pruned: epoch 2, batch 20
    assert checkpoints.newest(str(tmp_path)) == (step, {"epoch": 2, "batch": 6})
    with open(step, "wb") as f:
        f.write(b"not a zip")
    assert checkpoints.newest(str(tmp_path)) == (older, {"epoch": 2, "batch": 1})
    assert f"note: {step}: not a readable checkpoint" in capsys.readouterr().err
    assert checkpoints.newest(str(tmp_path / "none")) is None


def test_prune_keeps_the_newest(tmp_path):
    for epoch in range(1, 8):
        fake_checkpoint(tmp_path / "ckpt" / f"E{epoch:02d}L1.00B1.00.keras")
    for step in (10, 20, 30):
        fake_checkpoint(tmp_path / "ckpt" / "steps" / f"S{step:08d}.keras")
    checkpoints.prune(str(tmp_path), 3)
    assert [e for e, _ in checkpoints.epoch_checkpoints(str(tmp_path))] == [5, 6, 7]
    checkpoints.prune_steps(str(tmp_path), 2)
    assert [os.path.basename(p) for p in checkpoints.step_checkpoints(str(tmp_path))] == [
        "S00000020.keras", "S00000030.keras"]
    checkpoints.prune_steps(str(tmp_path))
    assert checkpoints.step_checkpoints(str(tmp_path)) == []


def test_a_checkpoint_from_before_the_choices_record_loads_with_either_kernels(tmp_path):
    """Checkpoints written before the model's choices travelled as one record have each choice as a
    key of the model's config; those written before the kernels were left out of it have the
    --kernels setting there. Either loads into the same model, with the kernels asked for, giving
    the same outputs, as does a checkpoint of today's format."""
    import dataclasses

    import keras
    import numpy as np
    from keras import ops

    from kernels import fast
    import hyperparams
    import model as transformer

    keras.utils.set_random_seed(3)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=1, num_heads=2, attention_output=False,
                             layer_norm_epsilon=1e-8, pad_logit="zero", output_vocab="all", kernels="fast")
    m = transformer.make_model(hp, 30)
    x = np.array([[5, 6, 7, 3]], np.int32)
    want = ops.convert_to_numpy(m((x, x), training=False))
    new = str(tmp_path / "new.keras")
    m.save(new)

    def older(name, edit):
        """The checkpoint with its config.json edited as an older format wrote it."""
        path = str(tmp_path / name)
        with zipfile.ZipFile(new) as z, zipfile.ZipFile(path, "w") as out:
            for item in z.namelist():
                data = z.read(item)
                if item == "config.json":
                    config = json.loads(data)
                    edit(config["config"])
                    data = json.dumps(config)
                out.writestr(item, data)
        return path

    flat = older("flat.keras", lambda c: c.update(c.pop("choices")))  # the old flat keys
    with_kernels = older("with_kernels.keras", lambda c: c.update(kernels="fast"))  # the setting saved too
    assert "kernels" not in json.loads(zipfile.ZipFile(new).read("config.json"))["config"]
    for path in (new, flat, with_kernels):
        for kernels in ("plain", "fast"):
            loaded = checkpoints.load(path, dataclasses.replace(hp, kernels=kernels))
            assert loaded.choices == m.choices and loaded.kernels == fast.choose(kernels)
            np.testing.assert_allclose(ops.convert_to_numpy(loaded((x, x), training=False)), want,
                                       rtol=1e-5, atol=1e-5)


def test_a_checkpoint_trained_in_mixed_precision_loads_with_every_layer_in_it(tmp_path):
    """A run trained in mixed bfloat16 saves its model's policy once, in the model's config; Keras
    gives it to the model alone, and the layers the model makes take the global policy (float32 in
    eval.py and translate.py). Loaded, and rebuilt, every layer computes as in training again; asked
    for float32 (trained.runs.USE_DTYPE; CTranslate2's check), every layer computes in float32."""
    import keras
    import numpy as np
    from keras import ops

    import hyperparams
    import model as transformer

    keras.utils.set_random_seed(3)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=1, num_heads=2, output_vocab="all")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        m = transformer.make_model(hp, 30)
    finally:
        keras.config.set_dtype_policy(previous)
    path = str(tmp_path / "mixed.keras")
    m.save(path)
    x = np.array([[5, 6, 7, 3]], np.int32)
    want = ops.convert_to_numpy(m((x, x), training=False))

    def policies(model):
        return {layer.dtype_policy.name for layer in model._flatten_layers()}

    loaded = checkpoints.load(path, hp)
    assert policies(m) == policies(loaded) == policies(transformer.rebuild(loaded, "plain")) == {"mixed_bfloat16"}
    np.testing.assert_array_equal(ops.convert_to_numpy(loaded((x, x), training=False)), want)
    assert policies(transformer.rebuild(loaded, dtype="float32")) == {"float32"}
    assert policies(checkpoints.load(path, hp, dtype="float32")) == {"float32"}  # as a trained run is used
    assert keras.config.dtype_policy().name == previous.name  # the global policy is left as it was


# The last commit before the model owned its cached decoder step and the code moved into folders
BEFORE_THE_LAYOUT = "29e35a7"


@pytest.mark.slow
def test_a_run_trained_before_the_layout_translates_the_same_after_it(quick_start, tmp_path):
    """A run trained by the project's code as it was before the layout change (BEFORE_THE_LAYOUT,
    taken from the repository's history, run unedited in a folder of its own) loads and translates
    the same lines to the same text with today's code: greedy and beam search, from its own
    translate.py and from today's."""
    old = tmp_path / "before"
    if subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{BEFORE_THE_LAYOUT}^{{commit}}"]).returncode != 0:
        pytest.skip(f"this checkout's history has no commit {BEFORE_THE_LAYOUT} (a shallow clone)")
    old.mkdir()
    archive = subprocess.run(["git", "-C", ROOT, "archive", BEFORE_THE_LAYOUT], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    log = tmp_path / "run"
    trained = subprocess.run([sys.executable, "train.py", "--preset", "sample", "--prepro_dir", str(quick_start.prepro),
                              "--logdir", str(log), "--num_epochs", "1", "--d_model", "32", "--d_ff", "64",
                              "--num_blocks", "2", "--num_heads", "2"], cwd=old, env=env, capture_output=True,
                             text=True)
    assert trained.returncode == 0, trained.stderr[-2000:]
    lines = tmp_path / "in.de"
    lines.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n\nEine Frau liest ein Buch.\n",
                     encoding="utf-8")
    for beam in ("1", "4"):
        outputs = []
        for folder in (old, ROOT):
            out = tmp_path / f"out.{len(outputs)}.{beam}"
            run = subprocess.run([sys.executable, "translate.py", "--logdir", str(log), "--beam_size", beam,
                                  "--input", str(lines), "--output", str(out)], cwd=folder, env=env,
                                 capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-2000:]
            outputs.append(out.read_text(encoding="utf-8"))
        assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 4, outputs
