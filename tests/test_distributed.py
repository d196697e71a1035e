"""Data parallelism through the engines' own APIs, on the CPU: TensorFlow's MirroredStrategy over two
logical CPUs, keras.distribution.DataParallel over two JAX host devices, and
MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1. Each trains the same global
batches as one device does, split unevenly in real tokens, and must end with the same loss and
weights, with the port's Adam and with plain SGD (which shows a gradient summed instead of averaged).
The weighting: every real target token of the global batch counts the same, as on one device."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "tests", "dist_train.py")


def launch(out, strategy, backend="tensorflow", extra_env=None, args=()):
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("TF_CONFIG", None)
    env.update(extra_env or {})
    return subprocess.Popen([sys.executable, SCRIPT, str(out), "--strategy", strategy, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process, timeout=300):
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"timed out:\n{output[-3000:]}")
    assert process.returncode == 0, output[-3000:]
    return output


def weights(path, optimizer):
    with np.load(path) as z:
        return ({k: z[k] for k in z.files if k.startswith(f"{optimizer}:") and "/" in k},
                float(z[f"{optimizer}:loss"]), int(z["replicas"]))


def assert_same_training(path, reference):
    for optimizer in ("sgd", "adam"):
        got, loss, replicas = weights(path, optimizer)
        want, want_loss, _ = weights(reference, optimizer)
        assert replicas == 2
        assert loss == pytest.approx(want_loss, rel=1e-5), optimizer
        assert sorted(got) == sorted(want) and len(got) > 40
        for name in want:
            if name.endswith("key/bias") and optimizer == "adam":
                # q . b_k is the same for every key, so softmax ignores the key bias: its true gradient
                # is 0, and Adam turns the rounding noise of each engine into steps of +-lr.
                continue
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """Weights after training on one device (TensorFlow)."""
    path = tmp_path_factory.mktemp("single") / "one.npz"
    finish(launch(path, "one"))
    return path


@pytest.fixture(scope="module")
def single_jax(tmp_path_factory):
    """Weights after training on one device (JAX: its initial weights differ from TensorFlow's)."""
    pytest.importorskip("jax")
    path = tmp_path_factory.mktemp("single_jax") / "one.npz"
    finish(launch(path, "one", backend="jax"))
    return path


@pytest.mark.slow
def test_mirrored_strategy_on_two_logical_cpus_matches_one_device(single, tmp_path):
    out = finish(launch(tmp_path / "mirrored.npz", "mirrored", args=("--cpus", "2")))
    assert "strategy mirrored (2 replica(s))" in out
    assert_same_training(tmp_path / "mirrored.npz", single)


@pytest.mark.slow
def test_jax_data_parallel_on_two_host_devices_matches_one_device(single_jax, tmp_path):
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = finish(launch(tmp_path / "jax.npz", "auto", backend="jax", extra_env=flags))
    assert "strategy data_parallel (2 replica(s))" in out
    assert_same_training(tmp_path / "jax.npz", single_jax)


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_on_localhost_match_one_device(single, tmp_path):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    processes = []
    for index in range(2):
        config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        processes.append(launch(tmp_path / f"worker{index}.npz", "auto", extra_env={"TF_CONFIG": config}))
    outputs = [finish(p) for p in processes]
    assert all("strategy multi_worker (2 replica(s))" in o for o in outputs)
    assert not (tmp_path / "worker1.npz").exists()  # only the chief writes
    assert_same_training(tmp_path / "worker0.npz", single)
