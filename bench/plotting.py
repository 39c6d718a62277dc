"""matplotlib for the bench/ tools that draw (timeline.py, bench_modes.py --out).

Debian's python3-matplotlib is the one used; as root it is installed when missing (as
./run.sh and ./test.sh install what they need), otherwise the exact apt-get line is
printed. Only the benchmark path needs it: the build and the C++ tests never import it.
"""
import os
import subprocess
import sys

APT_LINE = "apt-get install -y --no-install-recommends python3-matplotlib"


DEBIAN_PYTHON = "/usr/bin/python3"


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend, installing python3-matplotlib if missing.

    Call it before any long work: when the running interpreter is not Debian's (a pyenv or
    venv python3 first on PATH) and lacks matplotlib, the script is started again under
    /usr/bin/python3, which sees the Debian package."""
    try:
        import matplotlib
    except ImportError:
        if not os.path.exists("/usr/lib/python3/dist-packages/matplotlib"):
            if os.geteuid() != 0:
                sys.exit(f"{os.path.basename(sys.argv[0])}: needs matplotlib; install it with: sudo {APT_LINE}")
            print(f"# matplotlib is missing; running: {APT_LINE}", file=sys.stderr, flush=True)
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            if subprocess.call(APT_LINE.split(), env=env) != 0:
                subprocess.check_call(["apt-get", "update"], env=env)
                subprocess.check_call(APT_LINE.split(), env=env)
        if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) and os.path.exists(DEBIAN_PYTHON):
            print(f"# {sys.executable} has no matplotlib; running again under {DEBIAN_PYTHON}", file=sys.stderr,
                  flush=True)
            os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
