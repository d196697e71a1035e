"""Where and how a run computes: the backend's devices, mixed precision, XLA compilation, the
padding multiple of training batches and data parallelism, resolved once from the settings.

The `auto` choices (docs/devices.md):
  - precision: mixed_bfloat16 on a GPU that has bfloat16 units (compute capability 8.0 or newer),
    and with TensorFlow on a CPU that has bfloat16 instructions (AVX512_BF16 or AMX: oneDNN's
    bfloat16 matmuls ran at twice the float32 rate there); float32 elsewhere.
  - jit_compile: XLA on a GPU and always on JAX (compiled by nature); off for TensorFlow on a
    CPU, where XLA made training steps slower, and where a file's decoding, one graph for every
    batch shape, ends sooner than with a compilation for each (docs/speed.md).
  - length_multiple: 8 where every batch shape is compiled (few shapes), else 1 (least padding);
    length_buckets: 16 where every batch shape is compiled (fewer shapes, less padding than 8).
  - strategy: MultiWorkerMirroredStrategy when TF_CONFIG names several workers, MirroredStrategy
    when TensorFlow sees several GPUs, keras.distribution.DataParallel when JAX sees several
    devices; else one device. The engines do the work: no parallelism code of our own.
"""
import contextlib
import dataclasses
import json
import os

from support.utils import UserError, compile_cache, cpu_has_bfloat16, import_keras, quiet_half_precision, \
    use_compile_cache

keras = import_keras()  # the first import of Keras in train.py and the benches: quietly

def backend():
    return keras.backend.backend()


def sync_variables(model):
    """Bring the variables into the model: Keras' JAX trainer keeps them outside it during fit, so
    a callback that reads or writes them (or saves a checkpoint) must sync first."""
    if getattr(model, "_jax_state", None) is not None:
        model.jax_state_sync()


def mean_over_replicas(x):
    """The mean of a scalar over the replicas of a tf.distribute step; x itself on one device and
    on other backends (JAX's DataParallel computes on the global batch)."""
    if keras.backend.backend() != "tensorflow":
        return x
    import tensorflow as tf

    context = tf.distribute.get_replica_context()  # None in a cross-replica context
    if context is None or context.num_replicas_in_sync == 1:
        return x
    return context.all_reduce(tf.distribute.ReduceOp.MEAN, keras.ops.stop_gradient(x))


def gpus():
    """The GPUs the backend sees."""
    if backend() == "tensorflow":
        import tensorflow as tf
        return tf.config.list_physical_devices("GPU")
    if backend() == "jax":
        import jax
        return [d for d in jax.devices() if d.platform == "gpu"]
    if backend() == "torch":
        import torch
        return list(range(torch.cuda.device_count()))
    return []


def compute_capability():
    """(major, minor) of the first GPU, or None."""
    found = gpus()
    if not found:
        return None
    if backend() == "tensorflow":
        import tensorflow as tf
        return tuple(tf.config.experimental.get_device_details(found[0]).get("compute_capability", (0, 0)))
    if backend() == "jax":
        return tuple(int(x) for x in str(getattr(found[0], "compute_capability", "0.0")).split("."))
    import torch
    return tuple(torch.cuda.get_device_capability(0))


def precision(hp, flags=None):
    """The Keras dtype policy name of a run. flags: the CPU's flags (default: utils.cpu_flags())."""
    if hp.precision != "auto":
        return hp.precision
    capability = compute_capability()
    if capability:
        return "mixed_bfloat16" if capability >= (8, 0) else "float32"
    return "mixed_bfloat16" if backend() == "tensorflow" and cpu_has_bfloat16(flags) else "float32"


def jit_compile(hp=None):
    """Whether training steps, and on TensorFlow the decoding loops, are compiled by XLA, as
    hp.jit_compile says (hp None: its auto choice)."""
    if hp is None or hp.jit_compile == "auto":
        return backend() == "jax" or (backend() == "tensorflow" and bool(gpus()))
    return hp.jit_compile == "on"


def length_multiple(hp):
    """The multiple that training batch lengths are padded to (where no buckets are)."""
    if hp.length_multiple:
        return hp.length_multiple
    return 8 if jit_compile(hp) else 1


# Where every batch shape is compiled: at most this many (data_load.length_buckets). On Multi30k's
# lengths 16 pad 9% of the tokens; multiples of 8 pad 19% in 20 shapes (docs/speed.md).
COMPILED_BUCKETS = 16


def length_buckets(hp):
    """How many batch shapes training pads to (data_load.length_buckets); 0: none."""
    if hp.length_buckets:
        return hp.length_buckets
    return COMPILED_BUCKETS if jit_compile(hp) and not hp.length_multiple else 0


def tf_config_workers():
    """(number of workers, this one's index) from TF_CONFIG; (1, 0) without it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 1, 0
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
        index = task["index"] + (len(cluster.get("chief", [])) if task["type"] == "worker" else 0)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"TF_CONFIG is not a valid cluster description ({e}): see docs/devices.md, "
                        f"'Several machines'") from None
    return workers, index


def strategy_name(hp):
    """The data-parallel strategy of a run, `auto` resolved."""
    if hp.strategy != "auto":
        return hp.strategy
    if backend() == "tensorflow":
        if tf_config_workers()[0] > 1:
            return "multi_worker"
        return "mirrored" if len(gpus()) > 1 else "one"
    if backend() == "jax":
        import jax
        return "data_parallel" if len(jax.devices()) > 1 else "one"
    return "one"


@dataclasses.dataclass
class Setup:
    """What `setup` chose, and the scope to build, compile and restore the model in."""
    precision: str
    jit_compile: bool
    length_multiple: int
    length_buckets: int
    compile_cache: str  # JAX's persistent compilation cache (compile_cache); None: off, or TensorFlow
    strategy: str
    replicas: int
    chief: bool  # writes checkpoints and logs (the others of a multi-worker run do not)
    scope: object

    def describe(self):
        return (f"backend {backend()}, {len(gpus())} GPU(s), precision {self.precision}, "
                f"XLA {'on' if self.jit_compile else 'off'}, lengths padded to "
                + (f"{self.length_buckets} buckets" if self.length_buckets else f"multiples of {self.length_multiple}")
                + f", strategy {self.strategy} ({self.replicas} replica(s))"
                + (f", compiled programs kept in {self.compile_cache}" if self.compile_cache else ""))


def setup(hp, devices=None):
    """Resolve the `auto` settings, set the global dtype policy and create the strategy.

    Call it first (MultiWorkerMirroredStrategy must exist before other TensorFlow work).

    Args:
      hp: Hparams.
      devices: for mirrored/data_parallel, the device names to use (default: every GPU, or every
        device JAX sees); tests pass two logical CPUs.
    """
    name = strategy_name(hp)  # hp is validated: every value is one of hyperparams' choices
    scope, replicas, chief = contextlib.nullcontext(), 1, True
    if name in ("mirrored", "multi_worker") and backend() != "tensorflow":
        raise UserError(f"--strategy {name} is TensorFlow's: with KERAS_BACKEND={backend()} use data_parallel")
    if name == "data_parallel" and backend() != "jax":
        raise UserError("--strategy data_parallel is keras.distribution's (JAX backend): with TensorFlow "
                        "use mirrored, or multi_worker with TF_CONFIG")
    if name == "multi_worker":
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope, replicas = strategy.scope(), strategy.num_replicas_in_sync
        chief = tf_config_workers()[1] == 0
    elif name == "mirrored":
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy(devices)
        scope, replicas = strategy.scope(), strategy.num_replicas_in_sync
    elif name == "data_parallel":
        import jax
        chosen = devices or jax.devices()
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=chosen))
        replicas = len(chosen)
    policy = precision(hp)
    if policy == "mixed_float16" and not gpus():
        print("note: --precision mixed_float16 on a CPU: float16 is a GPU format, which CPUs compute without a "
              "speed-up (docs/devices.md, 'Mixed precision')")
        if backend() == "tensorflow":
            quiet_half_precision()
    elif policy == "mixed_bfloat16" and not gpus() and not cpu_has_bfloat16():
        print("note: --precision mixed_bfloat16 on a CPU without bfloat16 instructions: expect no speed-up "
              "(docs/devices.md, 'Mixed precision')")
    keras.mixed_precision.set_global_policy(policy)
    # JAX's (TensorFlow read its XLA flags when this module imported Keras: eval.py and translate.py
    # set its cache before, trained.runs.load_trained)
    cache = compile_cache(hp) if backend() == "jax" else None
    if cache:
        use_compile_cache(cache)
    return Setup(policy, jit_compile(hp), length_multiple(hp), length_buckets(hp), cache, name, replicas, chief,
                 scope)


class DistributedTrainingFixes:
    """Overrides of keras.Model's training and test steps that tf.distribute needs; the
    Transformer inherits them (before keras.Model), so that the model class itself holds only
    the model."""

    def train_step(self, *args):
        return self.multi_worker_logs(super().train_step(*args))

    def test_step(self, *args):
        return self.multi_worker_logs(super().test_step(*args))

    def multi_worker_logs(self, logs):
        """Give the step's scalar logs an axis in a multi-worker TensorFlow run.

        Keras 3 averages a MultiWorkerMirroredStrategy run's logs with reduce(MEAN, axis=0),
        which fails on scalars (tensorflow/tensorflow#72388); the mean of one-element vectors
        over axis 0 and the workers is the scalar Keras means to report.
        """
        if keras.backend.backend() != "tensorflow":
            return logs  # JAX and PyTorch steps return other structures; nothing to fix there
        import tensorflow as tf
        strategy = getattr(self, "_distribute_strategy", None)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.num_replicas_in_sync > 1:
            return {name: keras.ops.reshape(value, (1,)) for name, value in logs.items()}
        return logs

    def _maybe_symbolic_build(self, *args, **kwargs):
        """Keras (TensorFlow trainer, under a tf.distribute strategy) builds what is not built yet
        from the first batch averaged across replicas: the ids come back float32, and a
        multi-worker strategy cannot average them at all. compile_model builds the model, the
        loss and the optimizer beforehand, so nothing is left to build from data."""
        loss = getattr(self, "_compile_loss", None)
        if self.built and (loss is None or loss.built) and (self.optimizer is None or self.optimizer.built):
            return
        super()._maybe_symbolic_build(*args, **kwargs)
