"""Train a tiny Transformer for a few steps on fixed global batches and save its weights, through
the same `devices.setup` path as train.py; tests/test_distributed.py compares the strategies.
Two copies train: one with the port's Adam, one with plain SGD, whose steps show the gradients'
scale (Adam's updates do not change when every gradient is doubled).

    python tests/dist_train.py OUT.npz --strategy one|mirrored|multi_worker|data_parallel [--cpus 2]

--cpus 2 splits TensorFlow's CPU into two logical devices (mirrored); for JAX, the caller sets
XLA_FLAGS=--xla_force_host_platform_device_count=2. multi_worker reads TF_CONFIG.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

STEPS, BATCH, VOCAB = 4, 8, 24
# Source and target lengths of the rows of every batch. The halves of a batch hold 14 and 23 real
# target tokens (with </s>), its interleaved halves 11 and 26: however an engine splits a global
# batch between two replicas, their shares are uneven, and a loss that weighed each replica's
# tokens by its own count would not be the single device's.
SRC_LENGTHS = [7, 2, 5, 3, 6, 1, 4, 2]
TGT_LENGTHS = [1, 2, 1, 6, 3, 7, 2, 7]


def batches(seed=0):
    """STEPS global batches ((x, decoder input), labels), each (BATCH, 8), from a fixed seed."""
    from data_load import training_arrays
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        src = [rng.integers(4, VOCAB, n) for n in SRC_LENGTHS]
        tgt = [rng.integers(4, VOCAB, n) for n in TGT_LENGTHS]
        out.append(training_arrays(src, tgt, multiple=8))
    return out


def with_sgd(m, learning_rate=0.5):
    """m compiled as compile_model does, with plain SGD for the optimizer."""
    import keras

    m.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=m.loss, jit_compile=m.jit_compile)
    from model import BUILD_IDS as ids  # built now, as compile_model builds (see Transformer._maybe_symbolic_build)
    m.compute_loss(x=(ids, ids), y=ids, y_pred=m((ids, ids)), training=False)
    m.optimizer.build(m.trainable_variables)
    return m


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--strategy", default="one")
    parser.add_argument("--cpus", type=int, default=1)
    args = parser.parse_args()
    import keras
    keras.config.disable_traceback_filtering()

    from support import devices
    import hyperparams
    import model as transformer

    device_names = None
    if args.cpus > 1:
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpus)
        device_names = [f"/cpu:{i}" for i in range(args.cpus)]
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0, lr=1e-3,
                             warmup_steps=2, strategy=args.strategy, precision="float32")
    run = devices.setup(hp, devices=device_names)
    data = batches()
    x = np.concatenate([b[0][0] for b in data])
    d = np.concatenate([b[0][1] for b in data])
    y = np.concatenate([b[1] for b in data])
    models = {}
    with run.scope:
        for name in ("adam", "sgd"):
            keras.utils.set_random_seed(0)  # the same initial weights for both
            models[name] = transformer.compile_model(transformer.make_model(hp, VOCAB), hp)
        models["sgd"] = with_sgd(models["sgd"])
    saved = {"replicas": run.replicas}
    for name, m in models.items():
        history = m.fit((x, d), y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        saved[f"{name}:loss"] = history.history["loss"][-1]
        saved.update({f"{name}:{w.path}": np.asarray(keras.ops.convert_to_numpy(w.value)) for w in m.weights})
        print(f"{run.describe()}: {name} loss {history.history['loss'][-1]:.6f}")
    if run.chief:
        np.savez(args.out, **saved)


if __name__ == "__main__":
    main()
