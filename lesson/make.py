"""Refresh the lesson: run lesson.ipynb top to bottom in a fresh copy of the repository's files (its
runs start from nothing, and yours in log/ are left alone), store its outputs and pictures in it,
and write lesson.zh.ipynb, the same cells and outputs with the Chinese text of docs/lesson.zh.json.

    python -m lesson.make           # after changing the lesson or the code it runs (1-2 minutes)
    python -m lesson.make --zh      # only lesson.zh.ipynb, after changing a translation

The notebook is stamped with a digest of its code cells and of the project files its outputs come
from (the modules, prepro.py and train.py): the tests fail, naming this command, when the stored
outputs are older than that code. Each translation records the digest of the English text it
translates, so a changed English cell asks for its translation to be updated too.
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time

from support.utils import UserError, atomic_write, run_cli

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
LESSON = os.path.join(HERE, "lesson.ipynb")
LESSON_ZH = os.path.join(HERE, "lesson.zh.ipynb")
TRANSLATIONS = os.path.join(HERE, "docs", "lesson.zh.json")
SCRIPTS_RUN = ("prepro.py", "train.py")  # the scripts the lesson runs; every module counts too
# the folders of modules the lesson's outputs may come from (not the tests, benches or this maker)
CODE_FOLDERS = ("support", "kernels", "trained")


def text_digest(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_script(path):
    with open(path, encoding="utf-8") as f:
        return 'if __name__ == "__main__":' in f.read()


def sources_digest(nb):
    """A digest of what the lesson's outputs depend on: its code cells, the project's modules and
    the scripts it runs."""
    top = [p for p in glob.glob(os.path.join(HERE, "*.py")) if os.path.basename(p) in SCRIPTS_RUN or not is_script(p)]
    files = sorted(top + [p for folder in CODE_FOLDERS for p in glob.glob(os.path.join(HERE, folder, "*.py"))])
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode("utf-8"))
    for path in files:
        with open(path, "rb") as f:
            digest.update(os.path.relpath(path, HERE).replace(os.sep, "/").encode() + f.read())
    return digest.hexdigest()[:16]


def read(path):
    import nbformat
    return nbformat.read(path, as_version=4)


def write(nb, path):
    import nbformat
    with atomic_write(path) as tmp:
        nbformat.write(nb, tmp)


def fresh_copy(dest):
    """Copy the repository's tracked files into dest, where a run of the lesson writes its prepro/
    and log/ folders from nothing (not over the user's); dest."""
    tracked = subprocess.run(["git", "ls-files"], cwd=HERE, capture_output=True, text=True)
    if tracked.returncode != 0:
        raise UserError(f"{HERE} is not a git checkout: the lesson runs in a copy of its tracked files")
    for name in tracked.stdout.splitlines():
        os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(os.path.join(HERE, name), os.path.join(dest, name))
    return dest


def execute(nb, cwd, timeout=600):
    """Run every cell of nb in a fresh kernel with cwd as its folder; a UserError naming the cell
    that failed."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    except CellExecutionError as e:
        raise UserError(f"the lesson stopped with an error:\n{str(e)[-3000:]}") from None
    return nb


def chinese(nb, translations):
    """lesson.zh.ipynb from the executed English notebook: each markdown cell's text from
    translations ({cell id: {"english": digest of the English text, "zh": text}})."""
    import copy

    zh = copy.deepcopy(nb)
    for cell in zh.cells:
        if cell.cell_type != "markdown":
            continue
        entry = translations.get(cell.id)
        if entry is None:
            raise UserError(f"{TRANSLATIONS}: no translation of cell {cell.id!r}; add one "
                            f'(with "english": "{text_digest(cell.source)}")')
        if entry["english"] != text_digest(cell.source):
            raise UserError(f"{TRANSLATIONS}: the translation of cell {cell.id!r} is of an older English text; "
                            f'update its "zh" and set "english" to "{text_digest(cell.source)}"')
        cell.source = entry["zh"]
    extra = set(translations) - {c.id for c in nb.cells}
    if extra:
        raise UserError(f"{TRANSLATIONS}: translations of cells the lesson no longer has: {', '.join(sorted(extra))}")
    return zh


def read_translations():
    with open(TRANSLATIONS, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zh", action="store_true", help="only write lesson.zh.ipynb from the stored lesson")
    args = parser.parse_args(argv)
    nb = read(LESSON)
    if not args.zh:
        start = time.time()
        print("running lesson.ipynb in a fresh copy of the repository ...", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            execute(nb, fresh_copy(scratch))
        nb.metadata["lesson"] = {"sources": sources_digest(nb)}
        write(nb, LESSON)
        print(f"ran it in {time.time() - start:.0f} s; wrote {LESSON}")
    zh = chinese(nb, read_translations())
    write(zh, LESSON_ZH)
    print(f"wrote {LESSON_ZH}")


if __name__ == "__main__":
    run_cli(main)
