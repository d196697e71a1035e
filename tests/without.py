"""Run one of the project's scripts with some packages made unimportable, as on a machine without them.

    KERAS_BACKEND=jax python tests/without.py tensorflow train.py --preset sample ...
    python tests/without.py core eval.py --preset sample     # only requirements/core.txt installed
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What requirements/core.txt leaves out (the other groups' packages, by their import names)
NOT_CORE = ["jax", "jaxlib", "ctranslate2", "tensorflow_text", "torch", "pytest", "xdist", "hypothesis",
            "nbclient", "nbformat", "ipykernel", "IPython", "flask", "werkzeug", "selenium"]

if __name__ == "__main__":
    names = NOT_CORE if sys.argv[1] == "core" else sys.argv[1].split(",")
    for name in names:
        sys.modules[name] = None  # `import name` now raises ImportError
    sys.argv = sys.argv[2:]
    script = os.path.join(ROOT, sys.argv[0])
    sys.path[:0] = [os.path.dirname(script), ROOT]  # as `python SCRIPT` would, and the project
    runpy.run_path(script, run_name="__main__")
