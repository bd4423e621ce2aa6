"""Every environment variable splitserve reads, in one table: `splitserve serve --help` prints it
and the README lists it; a test checks that the code names no other SPLITSERVE_* variable."""

from __future__ import annotations

# name -> what it does
ENV_VARS: dict[str, str] = {
    "SPLITSERVE_API_KEY": "the API key (or --api-key-file): requests need 'Authorization: Bearer "
    "<key>'",
    "SPLITSERVE_ADMIN_KEY": "the admin endpoints' own key (or [router] admin_key_file; never "
    "the API key): without one they are refused",
    "SPLITSERVE_LOG_LEVEL": "default of --log-level in every process (debug, info, warning, ...)",
    "SPLITSERVE_LOG_FORMAT": "default of --log-format in every process: text or json",
    "SPLITSERVE_FAULTS": "tests only: faults for the workers' sends (splitserve/faults.py)",
    "SPLITSERVE_PARENT_PID": "set by the launcher: a child exits when this process dies",
    "SPLITSERVE_CPUS": "set by the launcher from [cluster.cpus]: the CPUs a role is pinned to",
    "SPLITSERVE_IO_CPUS": "set by the launcher from [cluster.cpus] io: where ZeroMQ I/O runs",
    "SPLITSERVE_HOME": "deploy/supervisord*.conf and deploy/systemd: the install directory",
    "SPLITSERVE_CONFIG": "deploy/supervisord*.conf and deploy/systemd: the cluster file",
    "SPLITSERVE_LOGS": "deploy/supervisord*.conf: the log directory",
    "SPLITSERVE_PYTHON": "deploy/launch.sh: the Python to run (default: the checkout's .venv)",
    "SPLITSERVE_IMAGE_TEST": "tests only: 1 builds and runs the OCI image (make image-test)",
    "SPLITSERVE_QKERNEL": "the engine's native kernel library to load instead of the built one "
    "(splitserve/engine/kernels/qkernel.py; for kernel development)",
    "XLA_FLAGS": "XLA's own flags; an option set here wins over the engine's compile options",
}


def help_text() -> str:
    """The table as --help's epilog."""
    width = max(len(name) for name in ENV_VARS)
    lines = ["environment variables:"]
    lines += [f"  {name:<{width}}  {what}" for name, what in ENV_VARS.items()]
    return "\n".join(lines)
