"""Run in the reference's own process (reference_bridge/launch.py's LAUNCHER, `tensorflow` being
tensorflow.compat.v1),
by `reference.py export`: the reference's Transformer built by its own code, its variables given
the values of WEIGHTS.npz (the reference's variable names as keys, written from a port run), saved
by its own tf.train.Saver as PREFIX, with the reference's hparams file beside it.

    python -c LAUNCHER <reference dir> reference_bridge/process/save_checkpoint.py WEIGHTS.npz PREFIX <hparams>

Only the model's weights: the reference's test.py restores them. Its train.py cannot go on from
them: its tf.train.Saver restores every variable, the step and Adam's slots included, and stops with
"NotFoundError: Key beta1_power not found in checkpoint" (tests/test_reference.py runs it).
"""
import os
import sys

import numpy as np
import tensorflow as tf  # tensorflow.compat.v1 here
from hparams import Hparams  # the reference's own modules
from inputs import placeholders  # beside this file
from model import Transformer
from utils import save_hparams

weights, prefix = sys.argv[1], sys.argv[2]
hp = Hparams().parser.parse_args(sys.argv[3:])
save_hparams(hp, os.path.dirname(prefix))
(x, d, y), xs, ys = placeholders()
m = Transformer(hp)
memory, _, src_masks = m.encode(xs, training=False)  # builds every variable the reference's model has
m.decode(ys, memory, src_masks, training=False)
with np.load(weights) as values, tf.Session() as sess:
    variables = tf.global_variables()
    missing = sorted(set(v.op.name for v in variables) ^ set(values.files))
    if missing:
        sys.exit(f"error: {weights}: the reference's model and the weights given differ in: {', '.join(missing)}")
    for variable in variables:
        variable.load(values[variable.op.name], sess)
    tf.train.Saver().save(sess, prefix)
print(f"saved {prefix} ({len(variables)} variables)")
