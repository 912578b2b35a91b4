"""Process control: start tritonserver and the HTTP gateway as child processes, watch them, stop
them within their bounds, and clean up after them (what `make serve` runs: python -m rose_backend.launch).

    serve.py           the launcher's main(): servers, gateway, banner, signals
    tritonserver.py    TritonProcess, one tritonserver; gateway.py: GatewayProcess, the gateway by its
                       command line; child.py: what both share (process group, log, parent death, kill)
    triton_install.py  where tritonserver and its Python stub come from; triton_stop.py: its bounded stop
    gateway_watch.py   the gateway restarted when it dies, refused when another process serves its port
    deployment.py      the model repository, the models a folder is served with, the ports
    keys.py, argv_scrub.py   API and admin keys, hidden from process listings
    args.py, banner.py       the command line and what is printed once it serves
    supervision.py, connections.py   exit timeouts, compile caches, sockets (parent death and the
                       port check: rose_backend/processes.py, shared with the gateway)
"""
