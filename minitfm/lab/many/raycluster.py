"""Joining a Ray cluster for `minitfm sweep --on ray` (`ray_launcher.py` runs the jobs there).

The address is `--ray-address`, else $RAY_ADDRESS, else none: a Ray started on this machine for
the sweep. Before the sweep folder is made, an address is checked (`check_cluster`) in one line
each way it can fail: not HOST:PORT; nothing listening (a TCP connection, `CONNECT_S`); something
listening that does not answer as a Ray cluster (a web server, a port reused since); a cluster
with token authentication that refuses this sweep's token. Ray itself waits minutes in the first
cases, retrying and printing its C++ log lines, and deaf to SIGTERM meanwhile; so the question
goes to a child process (`python -P -m minitfm.lab.many.raycluster ADDRESS`) with a deadline,
whose output stays here, and the sweep stays free to stop.

Then `connect` joins with `ray.init`, whose job gets a `runtime_env` with a `working_dir` of an
empty folder: without one, Ray puts the driver's working folder (and its script's folder) first
on every worker's `sys.path` (`ray/_private/worker.py`, "Also add the current directory"), and a
`minitfm/` package or a `tqdm.py` lying there would be imported by every worker in place of the
installed one. With it, a worker's `sys.path` and working folder hold Ray's copy of that empty
folder instead, as `python -P` keeps the sweep's local children off the working folder
(`lab/child_process.py`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

from minitfm.errors import MinitfmError, quote
from minitfm.lab.child_process import python_module

RAY_MISSING = "Ray is not installed: pip install 'minitfm[ray]' (on every node of the cluster)"
ADDRESS_ENV = "RAY_ADDRESS"
CONNECT_S = 5.0  # how long the driver tries to reach a cluster's address before saying so
ANSWER_S = 10  # how long Ray's client waits for a cluster's answer (its default: 30 s)
PROBE_S = 90.0  # the deadline of the child that asks (it gives up by itself well before)
TOKEN_ERROR = 3  # the child's exit code: the cluster refused this sweep's token
NOT_RAY = 4  # the child's exit code: nothing there answers as a Ray cluster
NO_TOKEN = 5  # the child's exit code: RAY_AUTH_MODE is token, and no token is found here
GIVE_TOKEN = ("give the cluster's token (its head node's ~/.ray/auth_token) in "
              "~/.ray/auth_token, in a file named by RAY_AUTH_TOKEN_PATH, or in RAY_AUTH_TOKEN")


def import_ray():
    """The `ray` module, else one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise MinitfmError(RAY_MISSING) from None
    return ray


def cluster_address(address: str | None) -> tuple[str | None, str]:
    """The address to join (`--ray-address`, else $RAY_ADDRESS; None: start Ray here, as Ray
    means by `local`) and where it came from, for messages."""
    address, source = (address, "--ray-address") if address else \
        (os.environ.get(ADDRESS_ENV), ADDRESS_ENV)
    return (None if address in (None, "", "local") else address), source


def check_cluster(address: str | None) -> None:
    """Refuse now, in one line, a cluster the sweep cannot use (see the module docstring)."""
    import_ray()
    address, source = cluster_address(address)
    if address is None or address == "auto":  # Ray's own: the cluster it finds on this machine
        return
    check_reachable(address, source)
    if not address.startswith("ray://"):  # Ray Client's server is no GCS to ask
        ask_cluster(address)


def host_port(address: str, source: str) -> tuple[str, int]:
    """HOST and PORT of `address` (`HOST:PORT` or `ray://HOST:PORT`), else one line."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise MinitfmError(f"{source} ({quote(address)}) is not HOST:PORT: give the head node's "
                           f"address with its port, e.g. 127.0.0.1:6379 (the port of ray start "
                           f"--head --port, 6379 by default)")
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_reachable(address: str, source: str = "--ray-address") -> None:
    """Refuse at once, in one line, an address nothing answers at (Ray would wait minutes)."""
    host, port = host_port(address, source)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S):
            pass
    except OSError as err:
        raise MinitfmError(f"cannot reach the Ray cluster at {quote(address)} "
                           f"({err.strerror or err}): start it (ray start --head), or give its "
                           f"address with --ray-address HOST:PORT") from None


def ask_cluster(address: str) -> None:
    """Whether a Ray cluster answers at `address` and takes this sweep's token, asked of a child
    process (`main`) with a deadline; its output and Ray's log lines stay here."""
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": str(int(CONNECT_S)),
           "RAY_py_gcs_connect_timeout_s": str(ANSWER_S)}
    proc = subprocess.Popen([*python_module(__name__), address], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env)
    try:
        said, _ = proc.communicate(timeout=PROBE_S)
    except subprocess.TimeoutExpired:
        said = f"no answer in {PROBE_S:.0f} s"
    finally:  # a deadline passed, or SIGTERM / Ctrl-C while it asked: it ends with the sweep
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    why = said.strip().splitlines()[-1] if said.strip() else f"exit {proc.returncode}"
    if proc.returncode == TOKEN_ERROR:
        raise MinitfmError(f"the Ray cluster at {quote(address)} uses token authentication and "
                           f"refused this sweep ({why}): set RAY_AUTH_MODE=token, and "
                           f"{GIVE_TOKEN}")
    if proc.returncode == NO_TOKEN:
        raise MinitfmError(f"RAY_AUTH_MODE is token, but no Ray token is found here for the "
                           f"cluster at {quote(address)}: {GIVE_TOKEN}")
    if proc.returncode != 0:
        raise MinitfmError(f"nothing at {quote(address)} answers as a Ray cluster ({why}): "
                           f"check the address and port (ray start --head prints them)")


def connect(address: str | None, say: Callable[[str], None]):
    """Ray, connected to the cluster at `address` (else $RAY_ADDRESS, else a Ray started on
    this machine for this sweep), its workers off the driver's working folder."""
    ray = import_ray()
    logging.getLogger("ray").setLevel(logging.ERROR)  # its notices are not the sweep's lines
    address, _ = cluster_address(address)
    # With no address Ray would join any cluster it finds running here (`ray start` leaves its
    # address in /tmp/ray); "local" starts one of this sweep's own, as the help says.
    with tempfile.TemporaryDirectory(prefix="minitfm-ray-") as empty:  # sent at init
        try:
            ray.init(address=address or "local", runtime_env={"working_dir": empty},
                     logging_level="ERROR", log_to_driver=False, include_dashboard=False,
                     configure_logging=False)
        except Exception as err:  # noqa: BLE001 - Ray's many errors: one line each
            where = f"join the Ray cluster at {quote(address)}" if address else "start Ray here"
            raise MinitfmError(f"cannot {where} ({last_line(str(err))})") from None
    nodes = [node for node in ray.nodes() if node["Alive"]]
    cpus = sum(node["Resources"].get("CPU", 0) for node in nodes)
    where = f"the cluster at {address}" if address else "a Ray started on this machine"
    say(f"on Ray: {where}, {len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:.0f} CPUs")
    return ray


def last_line(text: str) -> str:
    """The last non-empty line of an error's text (Ray's: a traceback, then the error)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def main(address: str) -> int:
    """In the child process: 0 when a Ray cluster answers at `address` and takes this process's
    token; else NO_TOKEN, TOKEN_ERROR or NOT_RAY, with Ray's reason as the last line of
    stdout."""
    from ray._private.authentication.authentication_token_setup import (
        ensure_token_if_auth_enabled,
    )
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)  # as ray.init does
    except AuthenticationError:
        return NO_TOKEN
    try:
        GcsClient(address=address)  # asks the cluster for its id: a Ray cluster answers
    except AuthenticationError as err:
        print(str(err.message).split(". ")[0].strip())
        return TOKEN_ERROR
    except Exception as err:  # noqa: BLE001 - whatever Ray says, that address is no cluster
        print(last_line(str(err)) or type(err).__name__)
        return NOT_RAY
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
