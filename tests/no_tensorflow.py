"""Run one of the project's scripts with TensorFlow made unimportable, as on a machine without it.

    KERAS_BACKEND=jax python tests/no_tensorflow.py train.py --preset sample ...
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    sys.modules["tensorflow"] = None  # `import tensorflow` now raises ImportError
    sys.path.insert(0, ROOT)
    sys.argv = sys.argv[1:]
    runpy.run_path(os.path.join(ROOT, sys.argv[0]), run_name="__main__")
