"""Records: a measured figure with what a reader needs to trust it, in a file a program can read.

A record is one JSON object, written by the script that measured its figures:

    {"kind": "bleu", "date": "2026-12-05", "commit": "1a2b3c4",
     "machine": {"cpu": "AMD EPYC 9R14 96-Core Processor", "class": "AMD EPYC, Zen 4", "cores": 2,
                 "bfloat16": true, "amx": false},
     "precision": "mixed_bfloat16", "command": "eval.py --preset sample", "figures": {...}}

eval.py writes one beside its results, the benches with --record PATH. The documents' tables are
drawn from the records kept in docs/records/ by bench/tables.py, which also copies a record there.
"""
import datetime
import json
import os
import subprocess
import sys

from support.utils import UserError, atomic_write, cpu_flags, cpu_has_bfloat16, cpuinfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# AMD's CPU family and model ranges that name a core generation (AMD's processor programming references)
AMD_CORES = ((23, range(0x00, 0x30), "Zen"), (23, range(0x30, 0x100), "Zen 2"), (25, range(0x00, 0x10), "Zen 3"),
             (25, range(0x20, 0x60), "Zen 3"), (25, range(0x10, 0x20), "Zen 4"), (25, range(0x60, 0x100), "Zen 4"),
             (26, range(0x00, 0x100), "Zen 5"))


def cpu_class(info):
    """A short name for a CPU's kind, the unit the documents' tables compare: "AMD EPYC, Zen 4", "Intel Xeon"."""
    name = info.get("model name", "unknown CPU")
    if info.get("vendor_id") == "AuthenticAMD":
        family, model = int(info.get("cpu family", 0)), int(info.get("model", 0))
        core = next((core for f, models, core in AMD_CORES if f == family and model in models), f"family {family}")
        return ("AMD EPYC" if "EPYC" in name else "AMD") + f", {core}"
    if "Xeon" in name:
        return "Intel Xeon"
    return name


def machine_fields():
    """The machine a figure was measured on: CPU, its class, cores, bfloat16 instructions and AMX."""
    info = cpuinfo()
    flags = cpu_flags(info=info)
    return {"cpu": info.get("model name", "unknown CPU"), "class": cpu_class(info), "cores": os.cpu_count(),
            "bfloat16": cpu_has_bfloat16(flags), "amx": "amx_bf16" in flags}


# Files that change no measured figure: a record's commit is not marked changed by them
NOT_CODE = (".md", ".ipynb", ".json", ".cff", ".png", ".zh.json")
NOT_CODE_FOLDERS = ("docs/", "tests/")


def commit():
    """The project's commit (short), with "+changes" where its code (tracked files but documents,
    pictures and tests) differs from it; "unknown" outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode:
        return "unknown"
    paths = [line[3:].split(" -> ")[-1] for line in changed.stdout.splitlines() if line.strip()]
    code = [p for p in paths if not p.endswith(NOT_CODE) and not p.startswith(NOT_CODE_FOLDERS)]
    return head.stdout.strip() + ("+changes" if code else "")


def command_line(argv=None):
    """The command that ran, as a user types it from the project's folder: `eval.py --preset sample`."""
    argv = sys.argv if argv is None else argv
    script = os.path.relpath(os.path.abspath(argv[0]), ROOT) if argv and argv[0].endswith(".py") else argv[0]
    return " ".join([script, *argv[1:]])


def make(kind, figures, precision, command=None, machine=None):
    """A record of the figures measured now, on this machine (or `machine`'s fields, where they were
    measured on another), by this commit."""
    return {"kind": kind, "date": datetime.date.today().isoformat(), "commit": commit(),
            "machine": machine or machine_fields(),
            "precision": precision, "command": command or command_line(), "figures": figures}


def write(path, record):
    with atomic_write(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


REQUIRED = ("kind", "date", "commit", "machine", "precision", "command", "figures")


def read(path):
    """One record; a UserError naming the file and the field where it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg}); write it again with the script that "
                        "measured it") from None
    missing = [key for key in REQUIRED if key not in record] if isinstance(record, dict) else list(REQUIRED)
    if missing:
        raise UserError(f"{path}: not a record, it lacks {', '.join(missing)}; records are written by eval.py "
                        "and the benches' --record")
    return record


def read_folder(folder):
    """The records of a folder, by file name, each with its "file"."""
    return [dict(read(os.path.join(folder, name)), file=name)
            for name in sorted(os.listdir(folder)) if name.endswith(".json")]
