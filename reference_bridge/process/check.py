"""Run in the reference's own process (reference_bridge/launch.py's LAUNCHER, `tensorflow` being
tensorflow.compat.v1),
by `reference.py check`: the reference's Transformer at random initial weights, its logits for the
first batch (inference mode, training=False), then a few steps of its own train() (its loss, its
noam_scheme, its tf.train.AdamOptimizer), a batch a step. Writes the checkpoint <logdir>/random-0
(before any step) with the reference's hparams file beside it, and OUT.npz with "0:logits", and
after each step k (1, 2, ...) every trainable variable as "k:<its name>" and the step's loss as
"k:loss", for the batches of BATCHES.npz (x0, d0, y0, x1, ...: source ids with </s>, decoder
input, target ids with </s>).

OPTIONS.json asks for three more things, each written into OUT.npz too:
- "dropout": the same random weights in a model of dropout rate "rate", its logits for the first
  batch in training mode drawn "draws" times, draw i in group i % "groups": per group, the sum and
  the sum of squares of the logits of the first "columns" ids at every target position that is not
  padding ("dropout:sum" and "dropout:squares", (groups, positions, columns), float64);
- "norm": its layer normalization (modules.ln, a scope of its own: gamma 1, beta 0) of
  BATCHES.npz's "norm_input" ("norm");
- "data": its own data_load.get_batch of the training files at "maxlen1"/"maxlen2" with "batch_size"
  sentences a batch, unshuffled: every batch's arrays ("data:<i>:x", "x_seqlens", "decoder_input",
  "y", "y_seqlens") and how many pairs it kept ("data:kept").

    python -c LAUNCHER <reference dir> reference_bridge/process/check.py BATCHES.npz OUT.npz OPTIONS.json <its hparams>
"""
import copy
import json
import os
import sys

import numpy as np
import tensorflow as tf  # tensorflow.compat.v1 here
from data_load import get_batch  # the reference's own modules
from hparams import Hparams
from inputs import placeholders  # beside this file
from model import Transformer
from modules import ln
from utils import save_hparams

batches, out = sys.argv[1], sys.argv[2]
with open(sys.argv[3], encoding="utf-8") as f:
    options = json.load(f)
hp = Hparams().parser.parse_args(sys.argv[4:])
save_hparams(hp, hp.logdir)
with np.load(batches) as data:
    steps = [tuple(data[f"{k}{i}"].astype(np.int32) for k in ("x", "d", "y")) for i in range(len(data.files) // 3)]
    norm_input = data["norm_input"]
# one graph for every batch: placeholders of any length, fed a batch a step
(x, d, y), xs, ys = placeholders()
tf.set_random_seed(0)
m = Transformer(hp)
loss, train_op, global_step, _ = m.train(xs, ys)
memory, _, src_masks = m.encode(xs, training=False)  # the same variables, in inference mode
logits, _, _, _ = m.decode(ys, memory, src_masks, training=False)
variables = tf.trainable_variables()
values = {}
random = os.path.join(hp.logdir, "random")
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    tf.train.Saver().save(sess, random, global_step=0)
    values["0:logits"] = sess.run(logits, dict(zip((x, d, y), steps[0])))
    for k, (xk, dk, yk) in enumerate(steps, 1):
        step_loss, _ = sess.run([loss, train_op], {x: xk, d: dk, y: yk})
        values[f"{k}:loss"] = step_loss
        for variable, value in zip(variables, sess.run(variables)):
            values[f"{k}:{variable.op.name}"] = value

# dropout: the random weights again, in a model whose dropout is on
tf.reset_default_graph()
dropped = copy.copy(hp)
dropped.dropout_rate = options["dropout"]["rate"]
(x, d, y), xs, ys = placeholders()
tf.set_random_seed(1)
m = Transformer(dropped)
memory, _, src_masks = m.encode(xs, training=True)
train_logits, _, _, _ = m.decode(ys, memory, src_masks, training=True)
normed = ln(tf.constant(norm_input), scope="check_ln")
groups, draws, columns = (options["dropout"][name] for name in ("groups", "draws", "columns"))
real = steps[0][2] != 0  # (N, T2): not padding
sums = np.zeros((groups, int(real.sum()), min(columns, values["0:logits"].shape[-1])))
squares = np.zeros_like(sums)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())  # check_ln's gamma and beta; the model's are restored
    tf.train.Saver(var_list=[v for v in tf.global_variables() if not v.op.name.startswith("check_ln")]).restore(
        sess, f"{random}-0")
    for i in range(draws):
        drawn = sess.run(train_logits, dict(zip((x, d, y), steps[0])))[real][:, :columns].astype(np.float64)
        sums[i % groups] += drawn
        squares[i % groups] += drawn ** 2
    values["norm"] = sess.run(normed)
values["dropout:sum"], values["dropout:squares"] = sums, squares

# data: the reference's own batches of the training files, in order
tf.reset_default_graph()
asked = options["data"]
data, num_batches, kept = get_batch(hp.train1, hp.train2, asked["maxlen1"], asked["maxlen2"], hp.vocab,
                                    asked["batch_size"], shuffle=False)
iterator = tf.data.Iterator.from_structure(data.output_types, data.output_shapes)
(bx, bx_seqlens, _), (bd, by, by_seqlens, _) = iterator.get_next()
with tf.Session() as sess:
    sess.run(iterator.make_initializer(data))
    for i in range(num_batches):
        arrays = sess.run({"x": bx, "x_seqlens": bx_seqlens, "decoder_input": bd, "y": by, "y_seqlens": by_seqlens})
        values.update({f"data:{i}:{name}": array for name, array in arrays.items()})
values["data:kept"] = kept
np.savez(out, **values)
