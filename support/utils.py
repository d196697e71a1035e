"""Helpers every script shares: the user-facing error, the CLI runner, atomic writes, logging, the
CPU's instruction sets.

The reference's utils.py held postprocess, save/load_hparams and calc_bleu; in the port those live
in data_load.py (decoding ids to text), hyperparams.py (settings) and eval.py (BLEU).
"""
import contextlib
import errno
import os
import re
import sys
import tempfile

# Keep TensorFlow's C++ log lines below errors out of the scripts' output (import_keras filters the
# start-up lines printed before this takes effect).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's default CPU allocator takes every tensor from malloc, which maps anything over 32 MB
# fresh from the kernel and unmaps it when freed, so large tensors such as the (N, T, V) logits are
# page-faulted in anew every training step. Its BFC allocator keeps the memory and reuses it. Read
# when TensorFlow first allocates, so setting it here, on importing any of the project's modules,
# is early enough. TF_CPU_ALLOCATOR_USE_BFC=false in the environment keeps the default.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


# TensorFlow's start-up lines on a machine without a GPU: its oneDNN and CPU-feature notes and its
# CUDA probing, printed by C++ before TF_CPP_MIN_LOG_LEVEL applies ("All log messages before
# absl::InitializeLog() ...").
STARTUP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cuda_platform|cuda_executor|cuda_dnn|cuda_fft|cuda_blas|"
    r"cpu_feature_guard|cpu_utils)\.cc:\d+\] .*"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
    # its first float16 tensor on a CPU without AVX512-FP16: float16 is computed right, by Eigen
    r"|E\d{4} [\d:.]+ +\d+ util\.cc:\d+\] oneDNN supports DT_HALF only on platforms with AVX-512\. .*")


@contextlib.contextmanager
def startup_lines_caught():
    """TensorFlow's start-up lines written to stderr inside the block are caught at the file
    descriptor: those of STARTUP_NOISE dropped, the others written once each at its end."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode("utf-8", "replace").splitlines()
            kept = [line for line in dict.fromkeys(lines) if line.strip() and not STARTUP_NOISE.fullmatch(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def quiet_half_precision():
    """Make TensorFlow's first float16 tensor inside startup_lines_caught, so that its one-time
    error-level line about float16 on a CPU (which computes it correctly, without oneDNN) is dropped
    instead of printed by every script that runs a mixed_float16 model."""
    with startup_lines_caught():
        import tensorflow as tf

        tf.zeros((1,), tf.float16)


# The file the CPU's description is read from: /proc/cpuinfo, or in its place the file this names
# (the tests run the lesson as on a CPU without bfloat16 instructions with one that lists none)
CPUINFO = "TRANSFORMER_CPUINFO"


def cpuinfo(path=None):
    """The first processor's fields of /proc/cpuinfo, or of the file CPUINFO names ({} where there is
    none: not Linux). path: read this file instead."""
    fields = {}
    try:
        with open(path or os.environ.get(CPUINFO, "/proc/cpuinfo")) as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_flags(path=None, info=None):
    """The instruction-set flags of the CPU as Linux lists them (an empty set elsewhere); info: the
    fields cpuinfo() read already."""
    return set((cpuinfo(path) if info is None else info).get("flags", "").split())


BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_has_bfloat16(flags=None):
    """Whether the CPU has bfloat16 matmul instructions. flags: the CPU's flags (default: cpu_flags())."""
    return bool((cpu_flags() if flags is None else flags) & BF16_CPU_FLAGS)


def machine():
    """The CPU's name and family, its cores, and whether it has bfloat16 instructions and AMX: the
    line every measured figure names its machine by."""
    info = cpuinfo()
    name, family, flags = info.get("model name", "?"), info.get("cpu family", "?"), cpu_flags(info=info)
    bf16 = "with" if cpu_has_bfloat16(flags) else "without"
    amx = "with" if "amx_bf16" in flags else "without"
    return f"{name} (CPU family {family}, {os.cpu_count()} cores, {bf16} bfloat16 instructions, {amx} AMX)"


def backend_name():
    """Keras' backend: the imported Keras' own, or before Keras is imported, KERAS_BACKEND's (or
    TensorFlow, its default)."""
    if "keras" in sys.modules:
        return sys.modules["keras"].backend.backend()
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def compile_cache(hp):
    """The folder of XLA's persistent compilation cache for hp (None: off, or PyTorch): --compile_cache,
    or with auto compile_cache beside the run's folder (log/compile_cache for log/sample), shared by
    the runs there. JAX keeps every program it compiles there, TensorFlow its XLA programs (the
    decoding loops), or the decoding loops it traced as one graph (graphs/: support.graphs). A
    folder the user set for the backend wins (JAX_COMPILATION_CACHE_DIR, or
    TF_XLA_FLAGS' --tf_xla_persistent_cache_directory)."""
    backend = backend_name()
    if backend not in ("jax", "tensorflow") or hp.compile_cache == "off":
        return None
    if backend == "jax" and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    given = re.search(r"--tf_xla_persistent_cache_directory=(\S+)", os.environ.get("TF_XLA_FLAGS", ""))
    if backend == "tensorflow" and given:
        return given.group(1)
    if hp.compile_cache != "auto":
        return hp.compile_cache
    return os.path.join(os.path.dirname(os.path.abspath(hp.logdir)), "compile_cache")


def use_compile_cache(folder):
    """Keep every program XLA compiles in folder, and look there before compiling: a repeated or
    resumed run, or translate.py on the same file again, finds its programs compiled. JAX's before
    its first compilation; TensorFlow's before Keras is first imported (its XLA reads its flags when
    the devices are set up: import_keras)."""
    os.makedirs(folder, exist_ok=True)
    if backend_name() == "jax":
        import jax
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # small models' programs too
    elif f"--tf_xla_persistent_cache_directory={folder}" not in os.environ.get("TF_XLA_FLAGS", ""):
        flags = f"{os.environ.get('TF_XLA_FLAGS', '')} --tf_xla_persistent_cache_directory={folder}"
        os.environ["TF_XLA_FLAGS"] = flags.strip()


@contextlib.contextmanager
def compile_cache_while_keras_starts(hp):
    """XLA's persistent compilation cache for hp's run (compile_cache, use_compile_cache) while Keras
    starts within: TensorFlow's XLA reads TF_XLA_FLAGS when its devices start (import_keras), after
    which the variable is put back as it was, so that the processes this one starts (a test's, a
    notebook's) do not take this run's folder for one their user set."""
    folder, previous = compile_cache(hp), os.environ.get("TF_XLA_FLAGS")
    if folder:
        use_compile_cache(folder)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("TF_XLA_FLAGS", None)
        else:
            os.environ["TF_XLA_FLAGS"] = previous


_devices_probed = False  # by import_keras, in this process


def import_keras():
    """keras, imported (with its backend, and TensorFlow's devices initialised) without
    TensorFlow's start-up lines on stderr (startup_lines_caught). TRANSFORMER_VERBOSE=1 shows them
    all. Keras imported before (by a notebook, or a process this one was forked from) is probed for
    its devices here all the same, so their lines are caught too."""
    global _devices_probed
    if _devices_probed or os.environ.get("TRANSFORMER_VERBOSE") == "1":
        import keras
        return keras
    with startup_lines_caught():
        import keras
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf
            tf.config.list_physical_devices()  # probes CUDA now, inside the catch
    _devices_probed = True
    return keras


class UserError(Exception):
    """A problem the user can fix: bad input, missing files, settings that cannot work.

    The message names the file (and line) where there is one, and says what to do. Scripts print
    it on one line, without a traceback, and exit with status 2.
    """


def optional(module, group):
    """Import an optional package (requirements/<group>.txt), or stop with a UserError that says how
    to install it: `bash setup.sh` installs the core only."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        raise UserError(f"{package} is not installed (it is in the optional group '{group}', which `bash setup.sh` "
                        f"leaves out): run `bash setup.sh {group}` to add it ({e})") from None


# What to do about a file-system error, by errno
FILE_SYSTEM_ADVICE = {
    errno.ENOSPC: "free some space there or choose another directory; what was finished is kept",
    errno.EDQUOT: "free some space there or choose another directory; what was finished is kept",
    errno.EACCES: "check that you may write there, or choose another directory",
    errno.EPERM: "check that you may write there, or choose another directory",
    errno.EROFS: "that file system is read-only: choose another directory",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EEXIST: "a file of that name is in the way of a folder: move it or choose another path",
}


def file_system_error(e):
    """The one-line message of an OSError: the path, what happened, what to do."""
    where = e.filename or "a file"
    return f"{where}: {e.strerror or e}; {FILE_SYSTEM_ADVICE.get(e.errno, 'check the path and the disk')}"


def run_cli(main, argv=None):
    """Run main(argv); turn a UserError, or an error of the file system, into one line on stderr
    and exit status 2."""
    try:
        return main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"error: {file_system_error(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def check_writable(directory):
    """Create `directory` if needed and write a scratch file in it: a file-system error now, before
    long work, rather than after it."""
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f".probe-{os.getpid()}")
    with open(probe, "w") as f:
        f.write("ok")
    os.remove(probe)


def lock_directory(directory, record=True):
    """Hold an exclusive lock on `directory` (<directory>/.lock) for as long as the returned file
    stays open; the kernel releases it when the process ends, however it ends. A UserError naming
    the holder's process if another process holds it. record: write this process's id into the
    lock file now (else record_holder does it later: a run refused after locking leaves its folder
    as it was)."""
    import fcntl

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ".lock")
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise UserError(f"{directory} is in use by another training run (process {holder}); wait for it to "
                        f"end, or pass another --logdir") from None
    if record:
        record_holder(f)
    return f


def record_holder(lock):
    """Write this process's id into a lock file that lock_directory returned."""
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()


def peak_rss_mb():
    """This process's peak resident memory in MB. From VmHWM in /proc/self/status on Linux: the
    peak of the process's own memory. getrusage's ru_maxrss there also counts the parent's memory at
    fork time, carried across exec: a script started from a 2 GB pytest reported 2 GB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB elsewhere


@contextlib.contextmanager
def atomic_write(path):
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds.

    The temporary name keeps the extension (Keras checks `.keras`), so readers never see a
    half-written file under the real name.
    """
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def section(title):
    """Print a section header, as the reference's logs do (`# Load model`)."""
    print(f"# {title}", flush=True)
