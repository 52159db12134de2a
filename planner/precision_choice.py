"""`plan --precision auto`: the fastest training format the engine and the GPU run, chosen.

A thin loop over planner.search.search, one search per format (bf16, then each low precision
the engine offers with each of its recipes: planner.engines.<engine> `precisions`) that the GPU
runs (planner.precision.precision_problem, the one home of those rules). The fastest plan that
fits wins; the others are kept as `alternatives`, each with what it would give (its step and
memory, or why it gives nothing), for explain to show. bf16 stays the default: a format is
chosen only when asked (`--precision auto`), since it changes the numerics.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.errors import BadInput, NothingFits
from planner.precision import PRECISIONS, precision_problem

AUTO = "auto"


@dataclass
class FormatResult:
    precision: str
    recipe: str | None
    report: object = None        # planner.search.SearchReport (None: refused)
    why: str = ""                # why it gives no plan

    @property
    def step_time_s(self):
        b = self.report.best if self.report is not None else None
        return b.estimate.step_time_s if b is not None else None

    def to_dict(self) -> dict:
        b = self.report.best if self.report is not None else None
        out = {"precision": self.precision, "recipe": self.recipe}
        if b is not None:
            out.update(step_time_s=round(b.estimate.step_time_s, 6),
                       peak_needed_gib=round(b.estimate.peak_needed_gib, 3))
        else:
            out["why"] = self.why
        return out


def formats(engine, gpu) -> list:
    """(precision, recipe) pairs the engine runs on this GPU, bf16 first."""
    out = [("bf16", None)]
    for prec, recipes in engine.precisions:
        if prec == "bf16" or prec not in PRECISIONS:
            continue
        for recipe in recipes:
            if precision_problem(engine, gpu, prec, recipe) is None:
                out.append((prec, recipe))
    return out


def search_formats(model, cluster, fixed, seq_len, global_batch, engine, **kw) -> tuple:
    """(the fastest format's FormatResult, every FormatResult in formats() order). Raises the
    bf16 search's error when no format gives a plan."""
    from planner.search import search
    results, first_error = [], None
    for prec, recipe in formats(engine, cluster.gpu):
        f = dataclasses.replace(fixed, precision=prec, recipe=recipe)
        try:
            rep = search(model, cluster, f, seq_len, global_batch, engine=engine, **kw)
        except (BadInput, NothingFits) as e:
            first_error = first_error or e
            results.append(FormatResult(prec, recipe, why=str(e)))
            continue
        results.append(FormatResult(prec, recipe, rep,
                                    "" if rep.best is not None else "nothing fits"))
    fitting = [r for r in results if r.step_time_s is not None]
    if not fitting:
        if first_error is not None:
            raise first_error
        return results[0], results
    return min(fitting, key=lambda r: r.step_time_s), results


def choice_record(chosen: FormatResult, results: list) -> dict:
    """What the plan keeps of the choice (plan.search["precision_choice"])."""
    return {"chosen": chosen.precision, "recipe": chosen.recipe,
            "alternatives": [r.to_dict() for r in results]}


def choice_lines(record: dict) -> list:
    """The choice in words (planner.explain renders these)."""
    name = record["chosen"] + (f" ({record['recipe']})" if record.get("recipe") else "")
    lines = [f"precision: {name} chosen by --precision auto (the fastest format this engine "
             f"and GPU run; it changes the numerics, bf16 is the default)"]
    for alt in record["alternatives"]:
        fmt = alt["precision"] + (f" ({alt['recipe']})" if alt.get("recipe") else "")
        if "step_time_s" in alt:
            lines.append(f"    {fmt:<22} step {alt['step_time_s']:.2f} s, peak needed "
                         f"{alt['peak_needed_gib']:.1f} GiB")
        else:
            lines.append(f"    {fmt:<22} {alt['why']}")
    return lines
