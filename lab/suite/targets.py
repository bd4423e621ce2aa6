"""The targets table of lab/suite.md: one row per target, each with what was
measured and a verdict, from the sections' results; the detok-heavy load's two modes beside it."""

from __future__ import annotations

import statistics
from typing import Any

from lab.suite.results import SectionResult, find_run, server_figures
from splitserve.bench import report


def targets(results: dict[str, SectionResult]) -> str:
    """The suite's targets, one row each where the sections ran, and the detok-heavy load's two
    modes reported beside them."""
    tiny, detok = results.get("tiny"), results.get("detok")
    rows = [
        throughput_row(tiny),
        _step_gap_row(detok),
        *(_modes_row(tiny, c) for c in (64, 128)),
        _ttft_row(tiny),
    ]
    rows = [r for r in rows if r]
    if not rows:
        return "_No target applies to the sections run (or their runs failed; see below)._\n"
    return report.table(["target", "measured", "met"], rows) + _detok_modes_line(detok)


def throughput_row(tiny: SectionResult | None) -> list[str] | None:
    """Served at saturation against the ceiling: the mean over the loads above the slot count
    (each one a sample of the same saturated rate; the best of them would flatter it), with
    each load's figure and the terms of served = batch fill x slots / step gap beside it."""
    if not tiny or not tiny.ceiling:
        return None
    slots = tiny.section.slots
    runs = [r for r in tiny.reports.get("processes", {}).get("runs", [])
            if r.get("fraction_of_ceiling") is not None]  # fmt: skip
    # concurrency = slots leaves slots empty while each wave's prompts are prefilled in turn
    served = [r for r in runs if r["concurrency"] > slots] or [
        r for r in runs if r["concurrency"] >= slots
    ]
    if not served:
        return None
    f = statistics.fmean(r["fraction_of_ceiling"] for r in served)
    loads = "; ".join(_saturated_load(tiny, r) for r in served)
    return [
        "tiny-7m served throughput at saturation >= 90% of the engine ceiling",
        f"{f:.1%}, the mean over the loads above {slots} streams (processes): {loads}",
        "yes" if f >= 0.9 else "no",
    ]


def _saturated_load(tiny: SectionResult, run: dict[str, Any]) -> str:
    """One saturated load against the ceiling measured just before and just after it."""
    ceiling = run.get("ceiling") or tiny.mode_ceilings.get("processes") or tiny.ceiling
    f = run["fraction_of_ceiling"]
    parts = [f"{run['steady_output_tokens_per_s']:,.0f} of {ceiling['tokens_per_s']:,.0f} tok/s"]
    around = [b["tokens_per_s"] for b in ceiling.get("bracket", [])]
    if run.get("ceiling") and len(around) == 2:
        parts.append(f"ceiling before / after {around[0]:,.0f} / {around[1]:,.0f}")
    server = run.get("server") or {}
    # the whole run's mean (the recent window has quantiles only): a rate is tokens over the
    # whole time, its slow steps included, as the ceiling's mean step is
    gap = server.get("step_gap") or {}
    if gap.get("mean") and ceiling.get("step_s", {}).get("mean"):
        parts.append(f"step gap mean {gap['mean'] * 1e3:.2f} vs the ceiling's step mean "
                     f"{ceiling['step_s']['mean'] * 1e3:.2f} ms")  # fmt: skip
    fill = server.get("batch_fill")
    if fill:
        parts.append(f"batch fill {fill:.0%} over the whole run")
    if ceiling.get("tokens_per_s_p50"):  # shown beside: the stricter reading of "the ceiling"
        by_median = f * ceiling["tokens_per_s"] / ceiling["tokens_per_s_p50"]
        parts.append(f"{by_median:.1%} against slots / median step")
    return f"c={run['concurrency']} {f:.1%} ({', '.join(parts)})"


def _step_gap_row(detok: SectionResult | None) -> list[str] | None:
    """The detok-heavy load's p99 step gap against its median step, with the engine's own
    jitter beside it."""
    if not detok:
        return None
    run = find_run(detok, "processes", detok.section.concurrencies[-1])
    gap, gap_src = server_figures(run, "step_gap")
    step, _ = server_figures(run, "step_time")
    if not (gap and step and gap.get("p99") and step.get("p50")):
        return None
    ratio = gap["p99"] / step["p50"]
    alone = (detok.ceiling or {}).get("step_s") or {}
    context = []
    if step.get("p99"):
        context.append(f"p99 gap / p99 step {gap['p99'] / step['p99']:.2f}")
    if alone.get("p99") and alone.get("p50"):
        context.append(f"the engine alone, on an idle CPU: p99 / p50 step "
                       f"{alone['p99'] / alone['p50']:.2f}")  # fmt: skip
    return [
        "detok-heavy, processes: p99 step gap within 25% of the median step time",
        f"p99 gap {gap['p99'] * 1e3:.1f} ms / p50 step {step['p50'] * 1e3:.1f} ms "
        f"= {ratio:.3f} ({gap_src})" + "".join(f"; {c}" for c in context),
        "yes" if ratio <= 1.25 else "no",
    ]


def _modes_row(tiny: SectionResult | None, streams: int) -> list[str] | None:
    """The sweep at 64 and 128 streams is the targets' processes-vs-threads comparison."""
    p, t = find_run(tiny, "processes", streams), find_run(tiny, "threads", streams)
    if not (p and t):
        return None
    return [f"tiny: processes beat threads at {streams} streams (throughput and ITL p99)",
            *mode_comparison(p, t)]  # fmt: skip


def _ttft_row(tiny: SectionResult | None) -> list[str] | None:
    """TTFT at concurrency 1 against the bare prefill, split into the pipeline's share and
    the served prefill's."""
    run1 = find_run(tiny, "processes", 1)
    # the engine measured just before and after this load, as the throughput row does
    ceiling = (run1 or {}).get("ceiling")
    if not ceiling and tiny:
        ceiling = tiny.mode_ceilings.get("processes") or tiny.ceiling
    bare = (ceiling or {}).get("prefill_s") or {}
    if not run1 or not bare.get("p50"):
        return None
    ttft = run1["ttft_s"]["p50"]
    over = ttft - bare["p50"]
    measured = (f"TTFT p50 {ttft * 1e3:.1f} ms - prefill p50 {bare['p50'] * 1e3:.1f} ms = "
                f"{over * 1e3:+.1f} ms")  # fmt: skip
    served = ((run1.get("server") or {}).get("prefill_time") or {}).get("mean")
    if served:
        measured += (f"; served prefill mean {served * 1e3:.1f} ms, so the pipeline adds "
                     f"{(ttft - served) * 1e3:.1f} ms")  # fmt: skip
    return [
        "tiny-7m: TTFT at concurrency 1 exceeds bare prefill by < 5 ms (median)",
        measured,
        "yes" if over < 0.005 else "no",
    ]


def _detok_modes_line(detok: SectionResult | None) -> str:
    """The detok-heavy load runs at 128 streams only; threads mode is
    reported beside it, and the ceiling's drift between the two runs says how far to trust
    the difference."""
    c = detok.section.concurrencies[-1] if detok else 0
    p, t = find_run(detok, "processes", c), find_run(detok, "threads", c)
    if not (p and t):
        return ""
    measured, better = mode_comparison(p, t)
    step, _ = server_figures(p, "step_time")
    drift = ", ".join(f"{b['tokens_per_s']:,.0f}" for b in
                      (detok.ceiling or {}).get("bracket", []))  # fmt: skip
    return (f"\nBeside the targets, the detok-heavy load at {c} streams in both modes: "
            f"processes vs threads {measured} (processes better on both: {better}). Both modes "
            + (f"run its {step['p50'] * 1e3:.0f} ms steps " if step and step.get("p50") else
               "run ")
            + "near the engine ceiling, so they differ by little more than the engine's own "
            "drift between the two runs"
            + (f" (the ceiling before, between and after them: {drift} tok/s)" if drift else "")
            + ".\n")


def mode_comparison(p: dict[str, Any], t: dict[str, Any]) -> tuple[str, str]:
    """(figures, "yes"/"no") for processes run p against threads run t: throughput and ITL p99."""
    a, b = p["output_tokens_per_s"], t["output_tokens_per_s"]
    itl_p, itl_t = p["itl_s"]["p99"], t["itl_s"]["p99"]
    figures = (f"{a:,.0f} vs {b:,.0f} tok/s ({a / b - 1:+.0%}); ITL p99 "
               f"{report.fmt(itl_p, 1e3)} vs {report.fmt(itl_t, 1e3)} ms")  # fmt: skip
    return figures, "yes" if a > b and itl_p < itl_t else "no"
