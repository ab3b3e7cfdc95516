"""`python -m harness.runner.forkclient [-u] [-B] -c CODE`: the `python` of a local xdist worker
when the run has a fork server (harness.runner.forkserver, named by $REPRO_FORKSERVER). It asks
the server for a worker that runs CODE with this process's stdin, stdout and stderr, then
stands for it: it exits with the worker's status, and the worker is killed when it dies.

Without a server to ask (none named, or none listening), it becomes the worker itself: the
plain `python -c CODE` xdist would have run (so, too, when the server ends before answering).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from harness.runner import lifetime, sandbox
from harness.runner.forkserver import ADDRESS_ENV, HEADER

REPLY_TIMEOUT_S = 300  # the server answers once its imports are done: a busy machine makes them slow


def _plain(flags: list[str], code: str) -> None:
    """The worker xdist would have started, in a sandbox of its own (harness.runner.sandbox)."""
    command = sandbox.command([sys.executable, *flags, "-c", code])
    os.execv(command[0], command)


def main(argv: list[str]) -> int:
    lifetime.die_with_parent()  # the session's controller: this process, and so its worker, die with it
    flags, code = [a for a in argv[:argv.index("-c")] if a in ("-u", "-B")], argv[argv.index("-c") + 1]
    address = os.environ.get(ADDRESS_ENV)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not address:
            raise ConnectionRefusedError
        conn.connect("\0" + address)
    except OSError:
        conn.close()
        _plain(flags, code)
    body = json.dumps({"code": code, "env": dict(os.environ), "cwd": os.getcwd(), "flags": flags}).encode()
    conn.settimeout(REPLY_TIMEOUT_S)
    socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    replies = conn.makefile("rb")
    try:
        forked = json.loads(replies.readline() or b"{}")
    except (OSError, ValueError):
        forked = {}
    if "pid" not in forked:  # it ended without forking: a child it forked dies with it, before reading a byte
        print("repro: the run's fork server gave no worker; starting one here", file=sys.stderr)
        conn.close()
        _plain(flags, code)
    # The worker holds the channel's pipes alone: when it dies, its controller sees the pipes close.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    conn.settimeout(None)
    try:
        ended = json.loads(replies.readline() or b"{}")
    except (OSError, ValueError):
        ended = {}
    status = ended.get("exit", 1)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
