"""The worker process: serves compiled model nodes on one device over ZeroMQ (`python -m worker`).

  server.py       receive loop: ROUTER socket, handshake, admission to the queue, heartbeats, drain
  batch_queue.py  accepted batches with deadlines on this clock; the bounded queue
  bounds_check.py batches and requests checked against the compiled bounds (pure Python)
  compute.py      one thread per lane: drop expired requests, run the rest, reply
  lanes.py        CPU lane, or one CUDA stream + pinned staging buffer per lane
  runner.py       protocol batches <-> score / beam node calls
  profiler.py     warm-up and the latency profile fitted at start
  startup.py      wiring: artifacts -> lanes, runners, profile, Ready -> WorkerServer
"""
