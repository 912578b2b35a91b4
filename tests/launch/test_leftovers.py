"""The session's leak check (tests/support/leftovers.py) finds what the session started even where
its command line names no shared-memory prefix (a gateway, its workers): by the OWNER every child
inherits from the session's environment; a launch's processes by the OWNER it was given."""
import os
import subprocess
import sys

from support import leftovers

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_child_is_found_by_the_environment_it_inherited_and_a_stranger_is_not():
    assert os.environ[leftovers.OWNER] == leftovers.SESSION
    child = subprocess.Popen(SLEEP)
    stranger = subprocess.Popen(SLEEP, env={k: v for k, v in os.environ.items() if k != leftovers.OWNER})
    own_launch = subprocess.Popen(SLEEP, env={**os.environ, leftovers.OWNER: f"{leftovers.SESSION}launch99_"})
    try:
        found = leftovers.processes()
        assert child.pid in found and own_launch.pid in found and stranger.pid not in found, found
        assert leftovers.SESSION not in found[child.pid]                 # its command line names no prefix
        assert set(leftovers.processes([f"{leftovers.SESSION}launch99_"])) == {own_launch.pid}
    finally:
        for p in (child, stranger, own_launch):
            p.kill()
            p.wait()
    assert not {child.pid, own_launch.pid} & set(leftovers.processes())       # reaped: gone
