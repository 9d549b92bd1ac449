"""cluster.leftovers: a running process and a bound port are reported; gone ones are not."""

from __future__ import annotations

import socket
import subprocess
import sys

from course_utils import cluster


def test_leftovers_reports_a_live_process_and_a_bound_port_then_nothing():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = socket.socket()
    server.bind(("localhost", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        assert cluster.leftovers([process.pid], [port]) == {"processes": [process.pid],
                                                            "ports": [port]}
    finally:
        process.kill()
        process.wait()
        server.close()
    assert cluster.leftovers([process.pid], [port]) == {"processes": [], "ports": []}
