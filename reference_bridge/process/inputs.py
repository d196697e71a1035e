"""The reference's model inputs as placeholders of any batch size and length, for the scripts run in
its process (tensorflow being tensorflow.compat.v1 there): the (x, x_seqlens, sents1) and
(decoder_input, y, y_seqlens, sents2) tuples its Transformer takes, fed with x, d and y."""
import tensorflow as tf


def placeholders():
    """(x, d, y) placeholders, and xs, ys built from them as the reference's data_load builds them."""
    x, d, y = (tf.placeholder(tf.int32, (None, None)) for _ in range(3))
    n = tf.shape(x)[0]
    xs = (x, tf.reduce_sum(tf.to_int32(tf.not_equal(x, 0)), 1), tf.fill([n], ""))
    ys = (d, y, tf.reduce_sum(tf.to_int32(tf.not_equal(y, 0)), 1), tf.fill([n], ""))
    return (x, d, y), xs, ys
