"""The child's side of ``procs.Forked``: a project program run as ``python -m MODULE ARGS`` (or ``python
SCRIPT ARGS``) runs it, in a process forked from a server that has imported torch and transformers.

This module imports nothing of the project: the program's own modules are imported after the child has
taken its environment (``LORM_FAULT`` is read when ``common.infra.faults`` is imported), exactly as in a
process of its own. Only third-party modules come from the fork server (``procs.PRELOAD``)."""

from __future__ import annotations

import atexit
import io
import os
import random
import runpy
import socket
import sys


def _stream(fd: int) -> io.TextIOWrapper:
    """An unbuffered text stream on ``fd``, as ``PYTHONUNBUFFERED`` gives a fresh process."""
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", write_through=True)


def _fresh_seeds() -> None:
    """Seeds drawn anew, as a fresh interpreter draws them: a fork inherits the server's."""
    random.seed()
    for name, reseed in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
        if name in sys.modules:
            reseed(sys.modules[name])


def run(out: socket.socket, args: list[str], env: dict[str, str], cwd: str) -> None:
    """Run ``python args`` here: stdout and stderr into ``out``, in ``cwd`` with exactly ``env``; the program's
    ``sys.exit`` code is the process's exit code (``multiprocessing`` makes it so)."""
    for fd in (1, 2):
        os.dup2(out.fileno(), fd)
    out.close()
    sys.stdout, sys.stderr = _stream(1), _stream(2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _fresh_seeds()
    # sys.path as the interpreter builds it: the program's place, PYTHONPATH, then the installation's own
    # (the server's other entries are the test process's, tests/ among them)
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    installed = [p for p in sys.path if p.startswith((sys.prefix, sys.base_prefix))]
    try:
        if args[0] == "-m":
            sys.path[:] = [cwd, *pythonpath, *installed]
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[0])
            sys.path[:] = [os.path.dirname(script), *pythonpath, *installed]
            sys.argv = [script, *args[1:]]
            runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends its children with os._exit: the interpreter's exit, here
