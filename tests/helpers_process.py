"""Processes the tests start, as a person starts them from a terminal."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path


def ctrl_c_as_on_a_terminal() -> None:
    """A `preexec_fn`: Ctrl+C (SIGINT) reaches the child as it does from a terminal. A shell's background job (tests
    started with `&`) ignores SIGINT, and a child inherits that: kvviz then rightly leaves Ctrl+C alone, and a test
    of what Ctrl+C does would wait on a run that never ends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ----- `python -m kvviz` without paying for its imports every time -----

# The forking server. It imports `preload` (by default what kvviz's commands import before they run,
# kvviz.cli.commands.PRELOADS: torch, the engine, the exporters) and builds the GPT-2 tokenizer (once per process
# in kvviz too, shared by every command a process runs), says "ready", and then forks once per request. The child
# takes the request's standard output and error, environment, working folder and arguments, and runs
# `python -m kvviz ARGS` (runpy, as `-m` does) or `python -c CODE ARGS` at the top level of this script:
# SystemExit, an uncaught exception, the flush of stdout at exit and its "Exception ignored" are the interpreter's
# own, as in a process started afresh. The server reports the child's pid, then its exit status.
_SERVER = r"""
import gc, importlib, json, os, socket, sys

for _name in json.loads(sys.argv[2]):
    importlib.import_module(_name)
from kvviz.core.tokenizer import get_tokenizer

get_tokenizer()
gc.freeze()  # what every child shares: no collection looks at it again (a child would copy every page it touches)
_channel = socket.socket(fileno=int(sys.argv[1]))
_channel.send(b"ready")
while True:
    _message, _fds, _flags, _address = socket.recv_fds(_channel, 1 << 20, 2)
    if not _message:
        os._exit(0)
    _request = json.loads(_message)
    _pid = os.fork()
    if _pid == 0:
        break
    for _fd in _fds:
        os.close(_fd)
    _channel.send(json.dumps({"pid": _pid}).encode())
    _status = os.waitstatus_to_exitcode(os.waitpid(_pid, 0)[1])
    _channel.send(json.dumps({"status": _status}).encode())

_channel.close()
os.dup2(_fds[0], 1)
os.dup2(_fds[1], 2)
for _fd in _fds:
    os.close(_fd)
if _request["env"] is not None:
    os.environ.clear()
    os.environ.update(_request["env"])
os.chdir(_request["cwd"])
if _request["code"] is None:
    import runpy

    sys.argv = ["kvviz", *_request["args"]]
    runpy.run_module("kvviz", run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *_request["args"]]
    exec(compile(_request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def command_preloads() -> list[str]:
    """What kvviz's commands import before they run (kvviz.cli.commands.PRELOADS), every command's."""
    from kvviz.cli.commands import PRELOADS

    return sorted({name for names in PRELOADS.values() for name in names})


class ForkServer:
    """`python -m kvviz ARGS` (or `python -c CODE ARGS`) as processes forked from one that has already imported
    `preload` (torch alone takes seconds to import) and built the GPT-2 tokenizer. Each command is its own process,
    with its own stdout, stderr, working folder, signals and exit status; only that start is shared, and the server
    fails to start if it prints anything. `env` is the server's environment, and every child's unless its request
    gives one; `prefix` runs the server under another command (`unshare -U`). Where forking a process that has
    imported Qt and torch is not safe (anything but Linux), every command is started afresh instead."""

    forks = sys.platform.startswith("linux")

    def __init__(self, env: dict[str, str], preload: Sequence[str] | None = None, prefix: Sequence[str] = (),
                 timeout: float = 120) -> None:
        self._env, self._prefix = env, tuple(prefix)
        if not self.forks:
            return
        names = command_preloads() if preload is None else list(preload)
        self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ours.settimeout(timeout)
        self._said = tempfile.TemporaryFile()  # what the server prints, on either stream: nothing, or it fails
        self._server = subprocess.Popen([*prefix, sys.executable, "-c", _SERVER, str(theirs.fileno()),
                                         json.dumps(names)], env=env, stdout=self._said, stderr=self._said,
                                        pass_fds=(theirs.fileno(),), preexec_fn=ctrl_c_as_on_a_terminal)
        theirs.close()
        self._lock = threading.Lock()
        self._timeout = timeout
        self._broken = False
        try:
            ready = self._ours.recv(64)
        except TimeoutError:
            ready = b""
        self._said.seek(0)
        said = self._said.read().decode("utf-8", "backslashreplace")
        if ready != b"ready" or said:
            self.close()
            raise AssertionError(f"the fork server did not start cleanly: {ready!r}, it said: {said}")

    def start(self, args: Sequence[str], cwd: Path | str, stdout: str = "pipe", code: str | None = None,
              env: dict[str, str] | None = None) -> ForkedProcess | subprocess.Popen:
        """A child running `kvviz *args` (or `python -c code *args`) in `cwd`, its stderr a pipe and its stdout as
        `stdout` says: "pipe", "full" (/dev/full), "gone" (a pipe whose reader left before the child started) or
        "null" (/dev/null)."""
        if not self.forks:
            return self._started_afresh(args, cwd, stdout, code, env)
        if self._broken:
            raise AssertionError("the fork server lost track of an earlier child")
        err_read, err_write = os.pipe()
        if stdout in ("full", "null"):
            out_read, out_write = None, os.open("/dev/full" if stdout == "full" else os.devnull, os.O_WRONLY)
        else:
            out_read, out_write = os.pipe()
        request = json.dumps({"args": list(args), "cwd": str(cwd), "code": code, "env": env}).encode()
        if not self._lock.acquire(timeout=self._timeout):  # one child at a time: the server waits for its status
            raise AssertionError("the fork server's previous child still runs")
        try:
            socket.send_fds(self._ours, [request], [out_write, err_write])
            pid = json.loads(self._ours.recv(1 << 16))["pid"]
        except BaseException:
            self._lock.release()
            for fd in (err_read, out_read):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        if stdout == "gone":
            os.close(out_read)
            out_read = None
        return ForkedProcess(pid, self, None if out_read is None else os.fdopen(out_read, "rb"),
                             os.fdopen(err_read, "rb"))

    def _started_afresh(self, args: Sequence[str], cwd: Path | str, stdout: str, code: str | None,
                        env: dict[str, str] | None) -> subprocess.Popen:
        command = [*self._prefix, sys.executable, *(["-m", "kvviz"] if code is None else ["-c", code]), *args]
        target = open(os.devnull if stdout == "null" else "/dev/full", "wb") if stdout in ("full", "null") else None
        try:
            process = subprocess.Popen(command, stdout=target or subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                       env=self._env if env is None else env, preexec_fn=ctrl_c_as_on_a_terminal)
        finally:
            if target is not None:
                target.close()
        if stdout == "gone":
            process.stdout.close()
            process.stdout = None
        return process

    def _status(self, timeout: float | None, block: bool = True) -> int | None:
        """The running child's exit status; None where it runs still (`block` false, or after `timeout` s)."""
        try:
            self._ours.settimeout(self._timeout if timeout is None else timeout)
            try:
                message = self._ours.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
            except (BlockingIOError, TimeoutError):
                return None
            status = json.loads(message)["status"]
        except BaseException:
            self._broken = True  # a status that comes later would answer the next request
            self._lock.release()
            raise
        self._lock.release()
        return status

    def close(self) -> None:
        if not self.forks:
            return
        self._ours.close()  # the server sees the end of its requests and exits
        try:
            self._server.wait(30)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        self._said.close()


class ForkedProcess:
    """What the tests use of subprocess.Popen (stdout and stderr as binary pipes), for a child of a ForkServer."""

    def __init__(self, pid: int, server: ForkServer, stdout, stderr) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout, self.stderr = stdout, stderr
        self._server = server

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL unless it has exited, and its status taken (the server takes the next request only then)."""
        self.send_signal(signal.SIGKILL)
        self.wait()

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server._status(None, block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, negative for a signal, as Popen's (subprocess.TimeoutExpired after `timeout` s)."""
        if self.returncode is None:
            self.returncode = self._server._status(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def communicate(self, timeout: float) -> tuple[bytes | None, bytes]:
        """Everything the child writes to its pipes until it exits, and its exit status set, as Popen's."""
        read: dict[str, bytes] = {}
        readers = [threading.Thread(target=lambda name=name, stream=stream: read.update({name: stream.read()}),
                                    daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr)) if stream is not None]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait(timeout)
        return read.get("out"), read["err"]
