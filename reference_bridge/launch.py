"""Running the reference's own code: a clone at its pinned commit, its input files written from
prepro.py's ids, and its scripts run in a process of their own where TensorFlow 1 is stood in for
(SUBSTITUTIONS, LAUNCHER), its files unedited. The scripts of process/ run there too."""
import os
import subprocess
import sys

import data_load
from support.utils import UserError

REPOSITORY = "https://github.com/Kyubyong/transformer"
COMMIT = "fb023bb097e08d53baf25b46a9da490beba51a21"  # master, "removed query masking", 2019-09-24
# Every change made for today's TensorFlow, in the reference's process only: (what its code names,
# what stands in for it). No line of its files is edited.
SUBSTITUTIONS = (
    ("tensorflow (`import tensorflow as tf`)",
     "tensorflow.compat.v1 with TensorFlow 2's behaviour turned off (tf.disable_v2_behavior()): sessions, "
     "graphs, variable scopes and tf.train as in TensorFlow 1"),
    ("tf.contrib.layers.xavier_initializer", "tf.glorot_uniform_initializer, the same distribution (TensorFlow 2 "
                                             "has no tf.contrib)"),
    ("tf.layers (dense, dropout)", "tf_keras's TensorFlow 1 layers (TF_USE_LEGACY_KERAS=1): Keras 3 has none"),
)
# Run in the reference's process: the substitutions above, then its script as __main__.
LAUNCHER = """
import os, runpy, sys, types
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
tf.layers.dense, tf.layers.dropout  # load tf_keras's TensorFlow 1 layers before tensorflow is replaced
tf.contrib = types.SimpleNamespace(layers=types.SimpleNamespace(xavier_initializer=tf.glorot_uniform_initializer))
sys.modules["tensorflow"] = tf
code, script = sys.argv[1], os.path.join(sys.argv[1], sys.argv[2])  # one of the reference's, or a path
sys.path[:0] = [code, os.path.dirname(script)]  # the reference's modules first, then those beside the script
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""
FILES = ("train.py", "model.py", "modules.py", "data_load.py", "utils.py", "hparams.py", "multi-bleu.perl")
# Settings the reference's hparams.py takes and its code never reads: (name, why)
IGNORED = (("smoothing", "its model.py calls label_smoothing without hp.smoothing, so it always smooths by 0.1"),)
PROCESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process")  # our scripts run in its process


def reference_code(reference_dir, workdir):
    """The folder of the reference's files: reference_dir, checked, or a clone at COMMIT."""
    if reference_dir is None:
        reference_dir = os.path.join(workdir, "code")
        if not os.path.isdir(reference_dir):
            for command in (["git", "clone", "--quiet", REPOSITORY, reference_dir],
                            ["git", "-C", reference_dir, "checkout", "--quiet", COMMIT]):
                if subprocess.run(command).returncode != 0:
                    raise UserError(f"{' '.join(command)} failed: clone {REPOSITORY} yourself and pass "
                                    f"--reference_dir")
    missing = [name for name in FILES if not os.path.isfile(os.path.join(reference_dir, name))]
    if missing:
        raise UserError(f"--reference_dir {reference_dir}: no {', '.join(missing)}; give the folder of a "
                        f"clone of {REPOSITORY} at commit {COMMIT[:7]}")
    return os.path.abspath(reference_dir)


def write_inputs(prepro_dir, folder):
    """The split files and vocabulary of prepro_dir in the reference's format, in folder; the
    reference's file arguments for them."""
    sp = data_load.load_vocab(prepro_dir)
    meta = data_load.load_meta(prepro_dir)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    os.makedirs(folder, exist_ok=True)

    def write(name, lines):
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
        return path

    args = ["--vocab", write("bpe.vocab", pieces), "--vocab_size", str(len(pieces))]
    for split, flags in (("train", ("--train1", "--train2")), ("dev", ("--eval1", "--eval2"))):
        sides = zip(flags, (meta["src_lang"], meta["tgt_lang"]), data_load.load_split(prepro_dir, split))
        for flag, lang, ids in sides:
            args += [flag, write(f"{split}.{lang}.bpe", (" ".join(pieces[i] for i in row) for row in ids))]
    args += ["--eval3", write(f"dev.{meta['tgt_lang']}", data_load.load_text(prepro_dir, "dev", meta["tgt_lang"]))]
    return args


def run_reference(code, workdir, script, args):
    """Run the reference's script with args in workdir, in its own process (LAUNCHER); its exit status."""
    link = os.path.join(workdir, "multi-bleu.perl")
    if os.path.lexists(link) and not os.path.exists(link):  # a link left by a run of another --reference_dir
        os.remove(link)
    if not os.path.lexists(link):
        os.symlink(os.path.join(code, "multi-bleu.perl"), link)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return subprocess.run([sys.executable, "-c", LAUNCHER, code, script, *args], cwd=workdir, env=env).returncode



def train_reference(code, files, workdir, args):
    """Run the reference's train.py in workdir on the files write_inputs wrote, with args after them."""
    os.makedirs(workdir, exist_ok=True)
    print(f"the reference's train.py ({code}) in {workdir}, with: {' '.join(files + args)}", flush=True)
    status = run_reference(code, os.path.abspath(workdir), "train.py",
                           [os.path.abspath(a) if os.path.isfile(a) else a for a in files] + args)
    if status != 0:
        raise UserError(f"the reference's train.py stopped with exit status {status} (its output above)")

