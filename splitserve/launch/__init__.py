"""Process lifecycle, in one place: what starts a stack's roles, waits until they are ready,
watches them, restarts or stops them, and turns SIGTERM / SIGINT into a drain. `splitserve
serve` (cli.py), `deploy/launch.sh` (hostlaunch.py), the benchmark suite and the tests use it.

- roles.py: which roles a stack runs, the module each runs as, the config file children read.
- processes.py: ProcessStack, roles as OS processes: spawn, kill, restart, stop in order.
- threads.py: ThreadStack, the worker roles as threads of this process (threads mode).
- threads_main.py: threads mode's one process: the router with the worker threads beside it.
- health.py: readiness over the router's /health, waited for with a deadline.
- ready_lines.py: what `splitserve serve` prints while a stack starts (each worker as it becomes
  ready; who is still starting when nothing else was said for a while).
- probe.py: a role's health as the router sees it, for Kubernetes probes.
- supervise.py: the supervision loop: on a role's exit stop everything, or restart it with a
  back-off; a signal ends the loop so the stack drains.
- run_dir_watch.py: each supervision pass, whether the run directory is still there; a stack
  whose run directory was deleted is started again whole.
- stuck.py: which workers stopped making progress (their records: splitserve/progress.py);
  supervise.py kills them, and restarts them as any exit.
- ports.py: a free loopback port for a local stack's router.
- pipeline.py: worker roles plus a RouterCore on the caller's event loop (measurements, tests).
"""
