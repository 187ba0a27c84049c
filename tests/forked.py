"""Run a script or module as its own process, forked from a server that has already imported
what every command here imports (torch, TorchRec, Hydra, Lightning, matplotlib, Neo).

A recipe run as ``python recipes/plan.py ...`` spends about 4.5 s importing before it reads its
first argument; the suite runs such commands about a hundred times. :func:`run` gives the same
command line, working folder, environment, standard streams and exit status as
``subprocess.run(..., capture_output=True, text=True)``, in a process of its own, without the
imports. What a fork cannot give is left to a real subprocess instead:

- an environment that differs from the server's in a variable read at interpreter start or at
  import (``PYTHON*``, thread counts, the locale, ``MPLBACKEND``, ...), e.g. a plugin folder on
  PYTHONPATH or another hash seed;
- a platform without ``fork``;
- ``cold=True``, or ``NEO_TEST_COLD=1`` in the suite's environment: every command.

Known differences, which is why each script's main path is also run cold somewhere:

- the server's modules are all imported, so a script that uses a module it never imports
  (``matplotlib.pyplot`` after ``import matplotlib``) works forked and fails cold;
- logging handlers and warning filters are those the server's imports left (FBGEMM's root
  handler is dropped, as the plugin loader drops it in a cold run);
- every fork of a session has the server's hash seed; Python's and numpy's random states are
  seeded afresh in each;
- output a command's own children write after it ends is not waited for.

The server imports and does nothing else. Its imports start no thread besides OpenBLAS's pool
(checked), which OpenBLAS stops and restarts around a fork, so the forks are safe.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Read by the interpreter at start or by a library at import: a fork keeps the server's values.
# Read by the interpreter at start or by a library at import: a fork keeps the server's values.
STARTUP_VARS = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "TORCH_", "MPL", "CUDA_", "LD_", "TQDM_", "LC_",
                "LANG")

_SERVER_CODE = r"""
import json, os, sys
proto_in, proto_out = int(sys.argv[1]), int(sys.argv[2])
started_with = dict(os.environ)
def threads():
    return len(os.listdir("/proc/self/task"))
import numpy  # its OpenBLAS starts a thread pool, which it stops and restarts around a fork
blas = threads()
import torch, torchrec, torchrec.distributed, torchrec.distributed.planner, hydra, omegaconf
import lightning.pytorch, matplotlib, matplotlib.pyplot, tqdm
import neo_core.cli, neo_core.api, neo_core.training.run, neo_plugins
from tests.forked import _child
import importlib.metadata as md
for ep in md.entry_points(group="neo"):
    ep.load()
from neo_core.plugins import _drop_implicit_root_handler
_drop_implicit_root_handler()  # FBGEMM's, as a cold run drops it after loading the plugins
# what the imports set in the environment (Lightning's PYTORCH_NVML_BASED_CUDA_CHECK, ...), as a
# cold run's imports would set it
set_by_imports = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
requests = os.fdopen(proto_in, "r")
replies = os.fdopen(proto_out, "w", buffering=1)
replies.write(json.dumps({"ready": True, "threads": threads() - blas}) + "\n")
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        requests.close(); replies.close()
        _child(req, set_by_imports)
    replies.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
"""


def _child(req: dict, set_by_imports: Mapping[str, str]) -> None:
    """In the fork: become the command ``req`` describes, run it, exit as Python would."""
    import atexit as _atexit
    import io
    import multiprocessing.process
    import random
    import runpy
    import tempfile as _tempfile
    import threading
    import time

    import numpy as np

    code = 1
    try:
        os.setpgid(0, 0)  # its own group, so that a timeout ends what it started too
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update({**set_by_imports, **req["env"]})
        time.tzset()
        _tempfile.tempdir = None
        multiprocessing.process.ORIGINAL_DIR = req["cwd"]  # type: ignore[attr-defined]
        random.seed()
        np.random.seed()
        streams = [(s.encoding, s.errors) for s in (sys.__stdout__, sys.__stderr__)]
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], os.O_WRONLY),
                                (2, req["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # python -u is not used here
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False) if unbuffered else open(1, "wb", closefd=False),
            encoding=streams[0][0], errors=streams[0][1], write_through=unbuffered)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False) if unbuffered else open(2, "wb", closefd=False),
            encoding=streams[1][0], errors=streams[1][1], line_buffering=True, write_through=unbuffered)
        sys.argv = list(req["argv"])
        code = 0
        try:
            if req.get("module"):
                sys.path[0] = req["cwd"]
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            else:
                script = Path(req["cwd"], sys.argv[0]).absolute()  # as python makes __main__.__file__
                if not script.is_file():
                    print(f"{sys.executable}: can't open file {str(script)!r}: [Errno 2] No such file or directory",
                          file=sys.stderr)
                    raise SystemExit(2)
                sys.path[0] = str(script.resolve().parent)
                runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:  # as the interpreter reads it
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
            code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, then exit handlers
        _atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = code or 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == -signal.SIGINT:  # as python ends on an uncaught KeyboardInterrupt: by the signal
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER_CODE, str(req_r), str(rep_w)], cwd=ROOT, env=self.env,
            pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        os.close(req_r)
        os.close(rep_w)
        self.requests = os.fdopen(req_w, "w", buffering=1)
        self.replies = os.fdopen(rep_r, "r")
        hello = self._reply(timeout=180)
        if hello["threads"]:
            self.close()
            raise RuntimeError(f"the fork server started {hello['threads']} thread(s) while importing; forks are unsafe")

    def _reply(self, timeout: float | None) -> dict:
        ready, _, _ = select.select([self.replies], [], [], timeout)
        if not ready:
            raise TimeoutError
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit status {self.proc.wait()})")
        return json.loads(line)

    def run(self, argv: Sequence[str], module: str | None, cwd: Path, env: Mapping[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        """One command; on anything but its end (a timeout, Ctrl-C, the server gone) the
        command's process group and the server are ended (:func:`run` then starts another)."""
        args = [sys.executable, *(("-m", module, *argv[1:]) if module else argv)]
        pid = None
        with tempfile.TemporaryDirectory(prefix="neo-forked-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            out.touch()
            err.touch()
            req = {"argv": list(argv), "module": module, "cwd": str(cwd), "env": dict(env),
                   "stdout": str(out), "stderr": str(err)}
            try:
                self.requests.write(json.dumps(req) + "\n")
                pid = self._reply(timeout=60)["pid"]
                status = self._reply(timeout=timeout)["status"]
            except BaseException as exc:
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                self.kill()
                if isinstance(exc, TimeoutError) and pid is not None:
                    raise subprocess.TimeoutExpired(args, timeout, out.read_text(errors="replace"),
                                                    err.read_text(errors="replace")) from None
                raise
            return subprocess.CompletedProcess(args, status, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                pipe.close()

    def close(self) -> None:
        try:
            self.requests.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.kill()


_server: _Server | None = None


@atexit.register
def _close_server() -> None:
    if _server is not None:
        _server.close()


def _startup(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_VARS)}


def run(*command: str | Path, env: Mapping[str, str], cwd: Path = ROOT, timeout: float = 300,
        cold: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, forked from the preloaded server where that gives the same
    run (``cold``: never). ``command`` is a script and its arguments, or ``"-m", module,
    arguments...``."""
    global _server
    from tests.conftest import subprocess_env

    command = [str(c) for c in command]
    if _server is not None and _server.proc.poll() is not None:  # ended (a timeout, Ctrl-C): start another
        _server = None
    server_env = _server.env if _server is not None else subprocess_env()
    if (cold or os.environ.get("NEO_TEST_COLD") or not hasattr(os, "fork") or not os.path.isdir("/proc/self/task")
            or _startup(env) != _startup(server_env)):
        return subprocess.run([sys.executable, *command], cwd=cwd, env=dict(env), capture_output=True,
                              text=True, timeout=timeout)
    if not Path(cwd).is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(cwd))
    if _server is None:
        _server = _Server(server_env)
    module = command[1] if command[0] == "-m" else None
    argv = [module, *command[2:]] if module else command
    return _server.run(argv, module, Path(cwd), env, timeout)
