"""Run the project's scripts for the tests without paying for TensorFlow's import each time.

A fork server: `python tests/script_runner.py` imports Keras, TensorFlow and the other heavy
libraries once, without starting TensorFlow's runtime (no threads of its own yet, so forking is
safe), then reads requests, one JSON line each on stdin. For each it forks a child, which takes the
caller's folder, environment and arguments, sends its stdout and stderr to the files named, and
runs the script as `python script.py` would (runpy, __name__ == "__main__"); the server answers
the child's pid, then its exit status. Each run is a process of its own: nothing one run does
reaches another. conftest.run_script sends it the runs it can (`Runner.run`); the others, and every
test that needs a process of its own (signals, stdin, another backend, memory figures), start a
fresh interpreter as before.
"""
import json
import os
import subprocess
import sys
import threading

# Read when TensorFlow or Keras is imported: a run that sets them differently needs a fresh interpreter.
IMPORT_TIME_ENV = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "TRANSFORMER_VERBOSE",
                   "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES", "XLA_FLAGS", "TF_XLA_FLAGS")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(request):
    """In the forked child: run the request's script; never returns."""
    import runpy
    import traceback

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        script = request["script"]
        sys.argv = [script, *request["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        for name in ("support.utils", "support"):  # imported here from the project root: the script's own is read anew
            sys.modules.pop(name, None)
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        import atexit
        atexit._run_exitfuncs()  # what the script registered (writers flushing), as at a normal exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve():
    sys.path.insert(0, ROOT)
    from support.utils import startup_lines_caught

    with startup_lines_caught():  # TensorFlow's import-time lines, once, kept off the test output
        import keras  # noqa: F401  (the point: imported before the forks)
        import numpy  # noqa: F401
        import sacrebleu  # noqa: F401
        import sentencepiece  # noqa: F401
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else may write into the answers
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)


class Runner:
    """The client: a fork server started on first use, for this test process."""

    def __init__(self):
        self.server, self.env, self.lock = None, None, threading.Lock()

    def run(self, script, args, cwd, timeout, scratch):
        """`python script args` run by the server: (exit status, stdout, stderr), or None when the
        environment differs from the server's in what is read at import."""
        if self.server is None or self.server.poll() is not None:
            self.env = dict(os.environ)
            self.server = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if any(os.environ.get(k) != self.env.get(k) for k in IMPORT_TIME_ENV):
            return None
        out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        request = dict(script=script, args=args, cwd=cwd, env=dict(os.environ), out=out, err=err)
        with self.lock:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            pid = json.loads(self.server.stdout.readline())["pid"]
            expired = []
            timer = threading.Timer(timeout, lambda: (expired.append(True), os.kill(pid, 9)))
            timer.start()
            try:
                code = json.loads(self.server.stdout.readline())["code"]
            finally:
                timer.cancel()
        if expired:
            raise subprocess.TimeoutExpired([sys.executable, script, *args], timeout)
        texts = []
        for path in (out, err):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        return code, *texts


if __name__ == "__main__":
    serve()
