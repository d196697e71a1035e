"""Run in the reference's own process (reference_bridge/launch.py's LAUNCHER, `tensorflow` being
tensorflow.compat.v1),
by `reference.py check`: the reference's Transformer at random initial weights, its logits for the
first batch (inference mode, training=False), then a few steps of its own train() (its loss, its
noam_scheme, its tf.train.AdamOptimizer), a batch a step. Writes the checkpoint <logdir>/random-0
(before any step) with the reference's hparams file beside it, and OUT.npz with "0:logits", and
after each step k (1, 2, ...) every trainable variable as "k:<its name>" and the step's loss as
"k:loss", for the batches of BATCHES.npz (x0, d0, y0, x1, ...: source ids with </s>, decoder
input, target ids with </s>).

    python -c LAUNCHER <reference dir> reference_bridge/process/check.py BATCHES.npz OUT.npz <its hparams>
"""
import os
import sys

import numpy as np
import tensorflow as tf  # tensorflow.compat.v1 here
from hparams import Hparams  # the reference's own modules
from inputs import placeholders  # beside this file
from model import Transformer
from utils import save_hparams

batches, out = sys.argv[1], sys.argv[2]
hp = Hparams().parser.parse_args(sys.argv[3:])
save_hparams(hp, hp.logdir)
with np.load(batches) as data:
    steps = [tuple(data[f"{k}{i}"].astype(np.int32) for k in ("x", "d", "y")) for i in range(len(data.files) // 3)]
# one graph for every batch: placeholders of any length, fed a batch a step
(x, d, y), xs, ys = placeholders()
tf.set_random_seed(0)
m = Transformer(hp)
loss, train_op, global_step, _ = m.train(xs, ys)
memory, _, src_masks = m.encode(xs, training=False)  # the same variables, in inference mode
logits, _, _, _ = m.decode(ys, memory, src_masks, training=False)
variables = tf.trainable_variables()
values = {}
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    tf.train.Saver().save(sess, os.path.join(hp.logdir, "random"), global_step=0)
    values["0:logits"] = sess.run(logits, dict(zip((x, d, y), steps[0])))
    for k, (xk, dk, yk) in enumerate(steps, 1):
        step_loss, _ = sess.run([loss, train_op], {x: xk, d: dk, y: yk})
        values[f"{k}:loss"] = step_loss
        for variable, value in zip(variables, sess.run(variables)):
            values[f"{k}:{variable.op.name}"] = value
np.savez(out, **values)
