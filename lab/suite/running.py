"""A section end to end: the engine ceiling in a child process, then each mode's stack serving
the section's loads one after another, the ceiling measured again after each load."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from lab.suite import REPO
from lab.suite.brackets import bracketed, compact
from lab.suite.ceiling_process import CeilingProcess, CeilingProcessError, pin_to
from lab.suite.cpus import Cpus
from lab.suite.results import SectionResult, all_runs
from lab.suite.sections import Section, bench_settings
from lab.suite.stacks import SuiteStack, start_stack
from splitserve.bench.runner import fraction_of_ceiling, run_benchmark

log = logging.getLogger(__name__)


def start_ceiling_process(s: Section, work_dir: str, cpus: Cpus) -> CeilingProcess:
    """The engine alone, built once in a child process and measured between the served loads."""
    args = [
        "--model", s.model, "--engine", s.engine, "--slots", str(s.slots),
        "--context", str(s.context), "--steps", str(s.ceiling_steps),
        "--prompt-tokens", str(s.prompt_tokens), "--max-seq-len", str(s.max_seq_len),
    ]  # fmt: skip
    layout = cpus.layout() if s.pin_roles else None
    # one CPU, as each served engine has (XLA sizes its thread pool from the affinity mask)
    with open(os.path.join(work_dir, f"ceiling-{s.key}.log"), "wb") as fh:
        return CeilingProcess(args, fh, cwd=REPO, preexec_fn=pin_to(layout[0] if layout else None))


def measure_ceiling(probe: CeilingProcess | None, s: Section, tag: str,
                    res: SectionResult) -> dict | None:  # fmt: skip
    if probe is None:
        return None
    try:
        ceiling = probe.measure()
    except (CeilingProcessError, OSError, ValueError) as exc:
        res.errors.append(f"ceiling {tag}: {exc} (log in ceiling-{s.key}.log)")
        return None
    log.info("%s: ceiling %s: %s tokens/s", s.key, tag, f"{ceiling['tokens_per_s']:,.0f}")
    return ceiling


def run_section(s: Section, work_dir: str, cpus: Cpus) -> SectionResult:
    """Each mode's stack serves the section's loads one after another; the engine ceiling is
    measured before the first load and after each one, so that every load is judged against the
    two measurements on either side of it, seconds apart."""
    res = SectionResult(s)
    t0 = time.monotonic()
    layout = cpus.layout() if s.pin_roles else None
    probe = None
    if s.ceiling:
        log.info("%s: engine ceiling (%d slots, context %d)", s.key, s.slots, s.context)
        probe = start_ceiling_process(s, work_dir, cpus)
    try:
        before = measure_ceiling(probe, s, "before the loads", res)
        ceilings = [before]
        for mode in s.modes:
            mode_ceilings = [before]
            started: list[SuiteStack] = []
            try:
                # its processes may use every CPU
                stack = start_stack(s, mode, work_dir, cpus, started)
                for i in range(len(s.concurrencies)):
                    run = run_load(s, stack, i, cpus, layout)
                    run["mode"] = mode
                    run["name"] = f"{mode}, c={run['concurrency']}"
                    settings = run.pop("settings")
                    rep = res.reports.setdefault(mode, {"settings": settings, "runs": []})
                    rep["runs"].append(run)
                    after = measure_ceiling(probe, s, f"after {run['name']}", res)
                    run["ceiling"] = compact(bracketed([before, after]))
                    before = after
                    ceilings.append(after)
                    mode_ceilings.append(after)
            except Exception as exc:  # one stack failing must not lose the rest of the suite
                logs = ", ".join(st.log_dir for st in started)
                res.errors.append(f"{mode}: {type(exc).__name__}: {exc} (logs: {logs})")
                log.exception("%s: the %s stack failed", s.key, mode)
            finally:
                for st in started:
                    st.stop()
            if s.ceiling:
                res.mode_ceilings[mode] = bracketed(mode_ceilings)
    finally:
        if probe is not None:
            probe.close()
    res.ceiling = bracketed(ceilings)
    for run in all_runs(res):
        ceiling = run.get("ceiling") or res.mode_ceilings.get(run["mode"]) or res.ceiling
        run["fraction_of_ceiling"] = fraction_of_ceiling(run, ceiling)
    res.seconds = time.monotonic() - t0
    return res


def run_load(s: Section, stack: SuiteStack, load: int, cpus: Cpus, layout) -> dict[str, Any]:
    """One load against a ready stack, from the CPUs the decode worker does not own."""
    if layout:
        os.sched_setaffinity(0, layout[1])
    try:
        rep = run_benchmark(bench_settings(s, stack.url, load, warmup=load == 0))
    finally:
        os.sched_setaffinity(0, cpus.all)
    run = rep["runs"][0]
    # the section's settings, for the record (each call ran one of its loads)
    run["settings"] = rep["settings"] | {"concurrencies": list(s.concurrencies),
                                         "num_requests": list(s.num_requests)}  # fmt: skip
    log.info("%s: %s: %s tok/s, %d failed", stack.name, run["label"],
             f"{run['output_tokens_per_s']:,.0f}", run["requests_failed"])  # fmt: skip
    return run

