"""Run train.py and kill it with SIGKILL right after it has written the mid-epoch checkpoint of
step STEP: a crash at a known point, so that a test of resuming does not race the training process.

    python tests/interrupted_train.py STEP train.py --prepro_dir ... --logdir ...

Nothing in train.py changes: `utils.atomic_write`, which every checkpoint goes through, is wrapped
before train.py imports it.
"""
import contextlib
import os
import re
import runpy
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    kill_at = int(sys.argv[1])
    sys.argv = sys.argv[2:]
    script = os.path.join(ROOT, sys.argv[0])
    sys.path[:0] = [os.path.dirname(script), ROOT]
    from support import utils

    plain_atomic_write = utils.atomic_write

    @contextlib.contextmanager
    def atomic_write_then_die(path):
        with plain_atomic_write(path) as tmp:
            yield tmp
        found = re.search(r"S(\d+)\.keras$", path)
        if found and int(found.group(1)) == kill_at:  # the checkpoint is complete and in place
            os.kill(os.getpid(), signal.SIGKILL)

    utils.atomic_write = atomic_write_then_die
    runpy.run_path(script, run_name="__main__")
