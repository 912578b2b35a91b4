"""The first thing every model.py does inside Triton's Python backend stub: put the launcher's paths
on sys.path, ahead of the interpreter's own.

The stub runs its interpreter isolated (PYTHONPATH and the user site ignored): its sys.path holds the
interpreter's standard library and site-packages, the model's folders and the backend's. The
launcher passes this project's paths and its environment's site-packages as ROSE_PYTHONPATH
(launch/triton_install.py, server_env). A model.py cannot import this module before those paths are
on sys.path, so it appends them itself, imports this module through them and calls
launcher_paths_first():

    sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
    from rose_backend.triton.stub_path import launcher_paths_first; launcher_paths_first()

which takes that appended copy back off and adds each path as a site folder (its .pth files run:
the editable installs' finders) ahead of what the stub had. numpy only after it: imported before,
it comes from the interpreter's own site-packages (numpy 2 on some machines), whose arrays Triton
2.51 misreads.
"""
from __future__ import annotations

import os
import site
import sys

VARIABLE = "ROSE_PYTHONPATH"


def launcher_paths_first(environ: dict | None = None) -> None:
    paths = (os.environ if environ is None else environ).get(VARIABLE, "").split(os.pathsep)
    if sys.path[-len(paths):] == paths:
        del sys.path[-len(paths):]                      # the model.py's appended copy
    known = set(sys.path)
    for path in reversed([p for p in paths if p and p not in known]):
        before = list(sys.path)
        site.addsitedir(path)                           # also runs the folder's .pth files
        sys.path[:] = [p for p in sys.path if p not in before] + before
