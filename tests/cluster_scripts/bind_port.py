"""Worker stand-in without TensorFlow: listen on this task's port, ignore SIGTERM, sleep.

Used for fast start/stop cycles: stopping it needs the SIGKILL escalation, as a hung TensorFlow
worker does. With ``crash`` as argument, worker 1 fails after a few lines instead.
"""

import json
import os
import signal
import socket
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
port = int(config["cluster"]["worker"][index].rsplit(":", 1)[1])
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.bind(("localhost", port))
server.listen()
print(f"listening on {port}", flush=True)
if "crash" in sys.argv[1:] and index == 1:
    print("about to fail", flush=True)
    raise RuntimeError("worker 1 broke on purpose")
while True:
    time.sleep(1)
