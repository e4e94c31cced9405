"""Who a worker process is, in attempts: the identity its claims write and a rescue fences on.

Owns: `owner_of(pid)`, the one rule -- "<hostname>:<pid>", and in a pid namespace of its own (a
container) "<hostname>/<namespace inode>:<pid>" -- read by the runner (jobs.worker.runner
.worker_identity), the rescuer (jobs.worker.rescue) and the zombie drill (demo.drill), which
may not import the worker's rooms. And `os_user()`, who runs a `manage.py jobs` command when no
operator is named. Never: decides whether that process is alive.
"""

import getpass
import os
import socket

_INIT_PID_NS = 0xEFFFFFFC  # Linux's PROC_PID_INIT_INO: the host's own pid namespace


def owner_of(pid: int) -> str:
    """The identity of this host's process `pid` in attempts ("<hostname>:<pid>"), as its worker
    writes it (jobs.worker.runner.worker_identity) and its rescue fences on it. In a pid
    namespace of its own (a container) the namespace is named too ("<hostname>/<ns>:<pid>"):
    containers sharing a hostname (host networking, a fixed `hostname:`) number their
    processes alike (pid 9 in each), and a rescue in one must never take the other's jobs."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux, or no /proc: the hostname alone
        ns = _INIT_PID_NS
    host = socket.gethostname()
    return f"{host}:{pid}" if ns == _INIT_PID_NS else f"{host}/{ns}:{pid}"


def os_user() -> str:
    """The login name of this process's user, or "uid <n>" where it has none: a container run as
    a uid with no passwd entry and no USER or LOGNAME (Kubernetes' runAsUser, OpenShift), where
    getpass.getuser() raises (KeyError; OSError from Python 3.13) -- before, out of `manage.py
    jobs queues pause` and every operator action as a traceback instead of their own answer."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return f"uid {os.getuid()}"
