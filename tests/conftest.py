"""Shared fixtures: the project root on sys.path, small corpora written by the tests themselves."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GERMAN = ["Ein Mann fährt Fahrrad.", "Die Frau liest ein Buch.", "Das Kind spielt im Park.",
          "Zwei Hunde laufen am Strand.", "Ein Mädchen trinkt Wasser.", "Der Lehrer öffnet das Fenster."]
ENGLISH = ["A man rides a bike.", "The woman reads a book.", "The child plays in the park.",
           "Two dogs run on the beach.", "A girl drinks water.", "The teacher opens the window."]


def write_parallel(directory, prefix, src, tgt):
    os.makedirs(directory, exist_ok=True)
    for lang, lines in (("de", src), ("en", tgt)):
        with open(os.path.join(directory, f"{prefix}.{lang}"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)


@pytest.fixture
def tiny_corpus(tmp_path):
    """A parallel corpus of train/dev/test in tmp_path/raw."""
    raw = tmp_path / "raw"
    write_parallel(raw, "train", GERMAN * 5, ENGLISH * 5)
    write_parallel(raw, "dev", GERMAN[:3], ENGLISH[:3])
    write_parallel(raw, "test", GERMAN[3:], ENGLISH[3:])
    return raw


def run_script(*args, cwd=ROOT, timeout=600):
    """Run one of the project's scripts with this interpreter; returns the CompletedProcess."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
