"""What installing the project costs: for each requirement group, the size of the packages pip downloads
and the size of the virtual environment it makes, each group installed into a fresh environment (in a
temporary folder, deleted after) at requirements/lock.txt's versions, as setup.sh installs it.

    python bench/footprint.py core dev --record footprint.json

Needs the network (pip fetches the packages); takes minutes per group.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import records  # noqa: E402
from support.utils import UserError, run_cli  # noqa: E402


def size_mb(folder):
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                total += os.path.getsize(path)
    return round(total / 2 ** 20)


def install(group, work):
    """(MB downloaded, MB installed) of `group`: pip downloads its packages (the files a fresh
    install fetches, counted on disk), then installs them from there into a fresh environment."""
    venv, wheels = os.path.join(work, "venv"), os.path.join(work, "wheels")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    requirements = ["-r", f"requirements/{group}.txt", "-c", "requirements/lock.txt"]
    steps = (["download", "--quiet", "--dest", wheels], ["install", "--quiet", "--no-index", "--find-links", wheels])
    for step in steps:
        result = subprocess.run([python, "-m", "pip", *step, *requirements], cwd=records.ROOT)
        if result.returncode:
            raise UserError(f"pip {step[0]} of requirements/{group}.txt failed (exit {result.returncode}): see above")
    return size_mb(wheels), size_mb(venv)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("groups", nargs="+", help="requirement groups (requirements/<group>.txt): core, export, jax, "
                                             "page, dev")
    p.add_argument("--record", metavar="PATH", help="also write the figures as a record to this JSON file")
    args = p.parse_args(argv)
    for group in args.groups:
        if group == "lock" or not os.path.isfile(os.path.join(records.ROOT, "requirements", f"{group}.txt")):
            raise UserError(f"no requirement group {group!r}; the groups are requirements/*.txt but lock.txt")
    rows = []
    for group in args.groups:
        with tempfile.TemporaryDirectory(prefix="footprint-") as work:
            downloaded, installed = install(group, work)
        rows.append(dict(group=group, download_mb=downloaded, installed_mb=installed))
        print(f"{group}: {downloaded:,} MB downloaded, {installed:,} MB installed", flush=True)
    if args.record:
        python = ".".join(map(str, sys.version_info[:3]))
        records.write(args.record, records.make("footprint", dict(python=python, groups=rows), "-"))
        print(f"wrote the figures to {args.record}")
    return 0


if __name__ == "__main__":
    run_cli(main)
