"""Run one of the project's scripts with TensorFlow made unimportable, as on a machine without it.

    KERAS_BACKEND=jax python tests/no_tensorflow.py train.py --preset sample ...
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    sys.modules["tensorflow"] = None  # `import tensorflow` now raises ImportError
    sys.argv = sys.argv[1:]
    script = os.path.join(ROOT, sys.argv[0])
    sys.path[:0] = [os.path.dirname(script), ROOT]  # as `python SCRIPT` would, and the project
    runpy.run_path(script, run_name="__main__")
