"""Run in the reference's own process (reference.LAUNCHER, `tensorflow` being tensorflow.compat.v1):
its Transformer at random initial weights, read by nothing of the port. Writes the checkpoint
<logdir>/random-0 with the reference's hparams file beside it, and OUT.npz with the logits of
the decoder in inference mode (training=False) and the loss of its train() for the batch of
BATCH.npz (x: source ids with </s>, d: decoder input, y: target ids with </s>).

    python -c reference.LAUNCHER <reference dir> tests/reference_forward.py BATCH.npz OUT.npz <its hparams>
"""
import os
import sys

import numpy as np
import tensorflow as tf  # tensorflow.compat.v1 here
from hparams import Hparams  # the reference's own modules
from model import Transformer
from utils import save_hparams

batch, out = sys.argv[1], sys.argv[2]
hp = Hparams().parser.parse_args(sys.argv[3:])
save_hparams(hp, hp.logdir)
with np.load(batch) as data:
    x, d, y = (data[k].astype(np.int32) for k in ("x", "d", "y"))
n = len(x)
xs = (tf.constant(x), tf.constant((x != 0).sum(1).astype(np.int32)), tf.constant([""] * n))
ys = (tf.constant(d), tf.constant(y), tf.constant((y != 0).sum(1).astype(np.int32)), tf.constant([""] * n))
tf.set_random_seed(0)
m = Transformer(hp)
loss, _, _, _ = m.train(xs, ys)  # as its training computes it (dropout_rate 0: nothing dropped)
memory, _, src_masks = m.encode(xs, training=False)
logits, _, _, _ = m.decode(ys, memory, src_masks, training=False)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    tf.train.Saver().save(sess, os.path.join(hp.logdir, "random"), global_step=0)
    values = sess.run({"logits": logits, "loss": loss})
np.savez(out, **values)
