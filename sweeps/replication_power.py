"""Variance components of the stale-samples rerun's paired differences, and the power of the replication's
registered tests (docs/results/stale_samples.md, "Pre-registered replication"), from the checked-in headline rows.

    python sweeps/replication_power.py            # the tables the pre-registration quotes
    python sweeps/replication_power.py --warm-starts 16 --seeds 2 --margin 0.02   # another design

**Components.** Per task and comparison H (arm minus base), the paired differences ``d[w, s]`` of warm start ``w``
and seed ``s`` (3 x 5 in the rerun) follow the one-way random-effects model ``d = mu + a_w + e_ws`` with
``var(a) = s2_ws`` (between warm starts) and ``var(e) = s2_seed`` (seed to seed within a warm start; it holds the
test prompts' sampling noise too). The ANOVA (method-of-moments) estimates of a balanced design (W warm starts, n
seeds each): ``MSW`` = the pooled within-warm-start variance (df W(n-1)), ``MSB = n var(warm-start means)``
(df W-1); ``s2_seed = MSW``, ``s2_ws = max(0, (MSB - MSW) / n)``; the intra-class correlation ``s2_ws / (s2_ws +
s2_seed)`` and the effective number of runs ``W n / (1 + (n-1) ICC)``. Upper bounds are one-sided 95% chi-square
bounds: ``s2_seed <= MSW df_w / chi2.ppf(0.05, df_w)``; ``E[MSB] = n s2_ws + s2_seed <= MSB df_b / chi2.ppf(0.05,
df_b)``, so ``s2_ws <= (that - MSW) / n``. Each holds with 95% on its own (both together with at least 90%); with 3
warm starts ``df_b`` is 2 and the bound on ``s2_ws`` is 19.5 times the mean square: that is what 3 warm starts know.

**Power.** The replication's test is the one-sample t over the W warm-start means (each over m seeds), df W-1. A
warm-start mean has variance ``V = s2_ws + s2_seed / m``; the mean over W has SE ``sqrt(V / W)``. The two-sided
t-test at level alpha has power ``P(|T| > t_{1-alpha/2, W-1})`` with ``T`` noncentral t (``scipy.stats.nct``,
noncentrality ``delta / SE``). Holm's first step tests at ``alpha / k`` (k: the family's size), so the power there
is a lower bound of Holm's for that comparison. TOST (on par within +-margin, each one-sided test at alpha) rejects
when the interval ``mean -+ t_{1-alpha} S`` lies inside the margins; its power is the exact integral over the
chi-square law of the estimated variance (``scipy.integrate.quad`` of ``scipy.stats`` densities), not the usual
two-noncentral-t difference (a lower bound, also printed by the tests).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sweeps"))
sys.path.insert(0, str(ROOT / "src"))

BOUND_LEVEL = 0.95  # one-sided confidence of each upper bound


@dataclass(frozen=True)
class Components:
    """The ANOVA of a balanced one-way random-effects design (``W`` warm starts x ``n`` seeds)."""

    warm_starts: int  # W
    seeds: int  # n per warm start
    mean: float  # grand mean of the differences
    msb: float  # n x the variance of the warm-start means (df W-1)
    msw: float  # pooled within-warm-start variance (df W(n-1))
    var_ws: float  # s2_ws, between warm starts (truncated at 0)
    var_seed: float  # s2_seed, seed to seed within a warm start
    var_ws_upper: float  # one-sided 95% upper bound of s2_ws
    var_seed_upper: float  # one-sided 95% upper bound of s2_seed

    @property
    def df_between(self) -> int:
        return self.warm_starts - 1

    @property
    def df_within(self) -> int:
        return self.warm_starts * (self.seeds - 1)

    @property
    def icc(self) -> float:
        """The within-warm-start correlation of two runs' differences, s2_ws / (s2_ws + s2_seed)."""
        total = self.var_ws + self.var_seed
        return self.var_ws / total if total > 0 else math.nan

    @property
    def effective_runs(self) -> float:
        """W n / (1 + (n-1) ICC): the independent runs the W n clustered ones are worth for the mean."""
        return self.warm_starts * self.seeds / (1 + (self.seeds - 1) * self.icc)

    def mean_variance(self, seeds: int, upper: bool = False) -> float:
        """The variance of one warm start's mean over ``seeds`` seeds, at the estimates or the upper bounds."""
        if upper:
            return self.var_ws_upper + self.var_seed_upper / seeds
        return self.var_ws + self.var_seed / seeds


def components(d: Sequence[Sequence[float]], level: float = BOUND_LEVEL) -> Components:
    """The variance components of ``d[w][s]`` (warm start ``w``, seed ``s``; every warm start the same number of
    seeds, at least 2 warm starts and 2 seeds).

    Raises:
        ValueError: a ragged or too small design, or a value that is not finite.
    """
    from scipy import stats as st

    try:
        arr = np.asarray(d, dtype=float)
    except ValueError:
        raise ValueError("components: every warm start needs the same number of seeds (a balanced design)") from None
    if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] < 2:
        raise ValueError(f"components: need at least 2 warm starts x 2 seeds, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("components: a difference is not finite")
    w, n = arr.shape
    means = arr.mean(axis=1)
    msb = float(n * means.var(ddof=1))
    msw = float(arr.var(axis=1, ddof=1).mean())
    df_b, df_w = w - 1, w * (n - 1)
    var_seed_upper = msw * df_w / st.chi2.ppf(1 - level, df_w)
    expected_msb_upper = msb * df_b / st.chi2.ppf(1 - level, df_b)
    return Components(w, n, float(arr.mean()), msb, msw, max(0.0, (msb - msw) / n), msw,
                      max(0.0, (expected_msb_upper - msw) / n), float(var_seed_upper))


def pooled(parts: Sequence[Components], level: float = BOUND_LEVEL) -> Components:
    """The components of several designs of one shape pooled (their mean squares averaged over equal df): e.g.
    one comparison over both tasks, if their variances are taken to be the same."""
    from scipy import stats as st

    shapes = {(c.warm_starts, c.seeds) for c in parts}
    if len(shapes) != 1:
        raise ValueError(f"pooled: the designs differ in shape {sorted(shapes)}")
    w, n = shapes.pop()
    msb = float(np.mean([c.msb for c in parts]))
    msw = float(np.mean([c.msw for c in parts]))
    df_b, df_w = len(parts) * (w - 1), len(parts) * w * (n - 1)
    return Components(len(parts) * w, n, float(np.mean([c.mean for c in parts])), msb, msw,
                      max(0.0, (msb - msw) / n), msw,
                      max(0.0, (msb * df_b / st.chi2.ppf(1 - level, df_b) - msw) / n),
                      float(msw * df_w / st.chi2.ppf(1 - level, df_w)))


def power_t(delta: float, var_mean: float, warm_starts: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test at level ``alpha`` over ``warm_starts`` warm-start means of
    variance ``var_mean`` each, when the true mean difference is ``delta`` (``scipy.stats.nct``)."""
    from scipy import stats as st

    df = warm_starts - 1
    crit = st.t.ppf(1 - alpha / 2, df)
    nc = delta / math.sqrt(var_mean / warm_starts)
    return float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))


def power_tost(delta: float, var_mean: float, warm_starts: int, margin: float, alpha: float = 0.05) -> float:
    """Exact power of TOST (both one-sided t-tests at ``alpha``; equivalence when the mean's ``1 - 2 alpha``
    interval lies inside +-``margin``) over ``warm_starts`` means of variance ``var_mean``, at true difference
    ``delta``: the integral over the chi-square law of the estimated variance of the normal probability that the
    mean lands inside ``+-(margin - t S)``."""
    from scipy import integrate
    from scipy import stats as st

    df = warm_starts - 1
    crit = st.t.ppf(1 - alpha, df)
    se = math.sqrt(var_mean / warm_starts)
    # S = se sqrt(u / df), u ~ chi2(df); equivalence needs margin - crit S > 0, i.e. u < df (margin / (crit se))^2
    u_max = df * (margin / (crit * se)) ** 2

    def inside(u: float) -> float:
        half = margin - crit * se * math.sqrt(u / df)
        return (st.norm.cdf((half - delta) / se) - st.norm.cdf((-half - delta) / se)) * st.chi2.pdf(u, df)

    value, _ = integrate.quad(inside, 0.0, u_max, limit=200)
    return float(min(1.0, max(0.0, value)))


def power_tost_nct_bound(delta: float, var_mean: float, warm_starts: int, margin: float,
                         alpha: float = 0.05) -> float:
    """The usual noncentral-t expression of TOST's power, ``P(T_upper < -t) - P(T_lower <= t)``: a lower bound
    of :func:`power_tost` (it counts the runs where both one-sided tests fail as if neither could), close to it
    when the SE is small against the margin."""
    from scipy import stats as st

    df = warm_starts - 1
    crit = st.t.ppf(1 - alpha, df)
    se = math.sqrt(var_mean / warm_starts)
    return float(max(0.0, st.nct.cdf(-crit, df, (delta - margin) / se) - st.nct.cdf(crit, df, (delta + margin) / se)))


def warm_starts_for(power: float, delta: float, var_ws: float, var_seed: float, seeds: int, alpha: float,
                    most: int = 500) -> int | None:
    """The fewest warm starts (2..``most``) at which the two-sided t over warm-start means reaches ``power`` for
    ``delta``; None if none does."""
    var_mean = var_ws + var_seed / seeds
    for w in range(2, most + 1):
        if power_t(delta, var_mean, w, alpha) >= power:
            return w
    return None


def differences(rows: list[dict], arm: str, base: str, warm_starts: Sequence[int], seeds: Sequence[int],
                metric: str = "test_mean_at_16", warm_start_key: str = "model.warmstart.seed") -> np.ndarray:
    """``d[w][s]`` = arm minus base on (warm start, seed), shape (len(warm_starts), len(seeds)), from results
    rows (``arm``, ``warm_start_key``, ``seed``, ``metric``).

    Raises:
        ValueError: naming the (arm, warm start, seed) a row is missing for.
    """
    values = {(r["arm"], int(r[warm_start_key]), int(r["seed"])): float(r[metric]) for r in rows}
    out = np.empty((len(warm_starts), len(seeds)))
    for i, w in enumerate(warm_starts):
        for j, s in enumerate(seeds):
            for a in (arm, base):
                if (a, w, s) not in values:
                    raise ValueError(f"no row for arm {a}, {warm_start_key}={w}, seed {s}")
            out[i, j] = values[(arm, w, s)] - values[(base, w, s)]
    return out


def seed_sd(rows: list[dict], arm: str, warm_starts: Sequence[int], seeds: Sequence[int],
            metric: str = "test_mean_at_16", warm_start_key: str = "model.warmstart.seed") -> tuple[float, int]:
    """One arm's seed-to-seed SD of ``metric`` within a warm start (pooled over the warm starts) and its df."""
    values = {(r["arm"], int(r[warm_start_key]), int(r["seed"])): float(r[metric]) for r in rows}
    arr = np.array([[values[(arm, w, s)] for s in seeds] for w in warm_starts])
    return float(math.sqrt(arr.var(axis=1, ddof=1).mean())), len(warm_starts) * (len(seeds) - 1)


@dataclass(frozen=True)
class Design:
    """The replication's registered design and tests (sweeps/replication.py holds the registered values)."""

    warm_starts: int
    seeds: int
    margin: float
    alpha: float
    family: dict  # comparison name -> the size of its Holm family


def power_rows(parts: dict, design: Design) -> list[dict]:
    """One row per (task, comparison) of ``parts`` ((task, name) -> Components): the components, their bounds,
    and the power of the registered tests at the estimates and at the upper bounds."""
    out = []
    for (task, name), c in parts.items():
        alpha = design.alpha / design.family[name]  # Holm's first step: a lower bound of its power
        row = {"task": task, "name": name, "c": c, "alpha": alpha}
        for tag, upper in (("est", False), ("upper", True)):
            v = c.mean_variance(design.seeds, upper)
            row[f"se_{tag}"] = math.sqrt(v / design.warm_starts)
            row[f"power_{tag}"] = power_t(design.margin, v, design.warm_starts, alpha)
            row[f"rerun_{tag}"] = power_t(c.mean, v, design.warm_starts, alpha)
            row[f"tost_{tag}"] = power_tost(0.0, v, design.warm_starts, design.margin, alpha)
            row[f"tost_rerun_{tag}"] = power_tost(c.mean, v, design.warm_starts, design.margin, alpha)
            row[f"need_{tag}"] = warm_starts_for(0.8, design.margin, c.var_ws_upper if upper else c.var_ws,
                                                 c.var_seed_upper if upper else c.var_seed, design.seeds, alpha)
        out.append(row)
    return out


def _sd(var: float) -> str:
    return f"{math.sqrt(var):.4f}"


def power_markdown(rows: list[dict], design: Design, title: str) -> str:
    """The tables of :func:`power_rows`: the components, then the power of the registered tests."""
    w, m, margin = design.warm_starts, design.seeds, design.margin
    lines = [f"**{title}: components**", "",
             "| task | H | rerun diff | SD warm start (95% upper) | SD seed (95% upper) | ICC | effective runs |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["c"]
        lines.append(f"| {r['task']} | {r['name']} | {c.mean:+.4f} | {_sd(c.var_ws)} ({_sd(c.var_ws_upper)}) | "
                     f"{_sd(c.var_seed)} ({_sd(c.var_seed_upper)}) | {c.icc:.2f} | "
                     f"{c.effective_runs:.1f} of {c.warm_starts * c.seeds} |")
    lines += ["", f"**{title}: power at {w} warm starts x {m} seeds** (in brackets: at the upper bounds)", "",
              f"| task | H | alpha (Holm, 1st step) | SE of the mean | t power, diff {margin:g} | t power, the rerun's "
              f"diff | TOST power, diff 0 | TOST power, the rerun's diff | warm starts for t power 0.8 at {margin:g} |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        need = [str(r[f"need_{t}"] or ">500") for t in ("est", "upper")]
        pair = {k: f"{r[k + '_est']:.2f} ({r[k + '_upper']:.2f})" for k in ("power", "rerun", "tost", "tost_rerun")}
        lines.append(f"| {r['task']} | {r['name']} | {r['alpha']:.4g} | {r['se_est']:.4f} ({r['se_upper']:.4f}) | "
                     f"{pair['power']} | {pair['rerun']} | {pair['tost']} | {pair['tost_rerun']} | "
                     f"{need[0]} ({need[1]}) |")
    return "\n".join(lines)


def report(results_dir: Path, design: Design) -> str:
    """Every table the pre-registration quotes, from the headline rows under ``results_dir``."""
    import stale_rerun

    parts, per_h, sds = {}, {}, []
    for task in stale_rerun.TASKS:
        path = results_dir / f"stale_headline_{task}.csv"
        rows = stale_rerun.read_rows(path, stale_rerun.HEADLINE_KEY)
        for name, arm, base in stale_rerun.COMPARISONS:
            d = differences(rows, arm, base, stale_rerun.WARM_STARTS, stale_rerun.SEEDS)
            parts[(task, name)] = components(d)
            per_h.setdefault(name, []).append(parts[(task, name)])
        sds.append((task, *seed_sd(rows, "onpolicy", stale_rerun.WARM_STARTS, stale_rerun.SEEDS)))
    both = {("both tasks", name): pooled(cs) for name, cs in per_h.items()}
    pooled_sd = math.sqrt(sum(sd ** 2 * df for _, sd, df in sds) / sum(df for *_, df in sds))
    sd_line = ("Seed-to-seed SD of `onpolicy` (k = 1) test mean@16 within a warm start (pooled over its 3 warm "
               "starts): " + ", ".join(f"{t} {sd:.4f} (df {df})" for t, sd, df in sds)
               + f"; both tasks {pooled_sd:.4f} (df {sum(df for *_, df in sds)}). "
               f"The margin {design.margin:g} is {design.margin / pooled_sd:.2f} of it; a user comparing one run of "
               f"each arm orders two arms {design.margin:g} apart rightly with probability "
               f"{_right_order(design.margin, pooled_sd):.2f} (0.50 is a coin).")
    w = design.warm_starts
    legend = ("From `sweeps/results/stale_headline_<task>.csv` (3 warm starts x 5 seeds, test mean@16). SD warm "
              "start: sqrt of the between-warm-start component of the paired difference; SD seed: of the "
              "within-warm-start one; in brackets their one-sided 95% chi-square upper bounds (df 2 and 12 per "
              "task, 4 and 24 pooled). ICC: the within-warm-start correlation; effective runs: W n / (1 + (n-1) ICC) "
              "of the W n runs (W 3 per task, 6 pooled; n 5). "
              f"Power: of the registered two-sided t over the {w} warm-start means (df {w - 1}) at alpha / (Holm "
              "family size), a lower bound of Holm's power, for a true difference equal to the margin and equal to "
              "the rerun's estimate (the rerun's own effect, replicated); TOST: of "
              f"showing on par within +-{design.margin:g} (each one-sided test at that alpha) when the true "
              "difference is 0 and when it is the rerun's estimate. In brackets: with both components at their upper bounds. Warm starts for 0.8: the "
              f"fewest ({design.seeds} seeds each) that give the t-test power 0.8 for a difference equal to the "
              "margin.")
    return "\n\n".join([
        f"Design: {w} warm starts x {design.seeds} seeds per arm and task, margin +-{design.margin:g}, alpha "
        f"{design.alpha:g}, Holm families: " + ", ".join(f"{k} {v}" for k, v in design.family.items())
        + " (registered in sweeps/replication.py).",
        power_markdown(power_rows(parts, design), design, "Per task"),
        power_markdown(power_rows(both, design), design, "Pooled over both tasks (the same variances assumed)"),
        legend, sd_line])


def _right_order(delta: float, sd: float) -> float:
    """P(one run of the better arm scores above one run of the other), two independent runs of SD ``sd``."""
    from scipy import stats as st

    return float(st.norm.cdf(delta / (sd * math.sqrt(2))))


def main(argv: list[str] | None = None) -> int:
    import replication as reg

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=ROOT / "sweeps" / "results", help="the folder of the headline rows")
    p.add_argument("--warm-starts", type=int, default=len(reg.WARM_STARTS["default"]))
    p.add_argument("--seeds", type=int, default=len(reg.SEEDS))
    p.add_argument("--margin", type=float, default=reg.MARGIN)
    p.add_argument("--alpha", type=float, default=reg.ALPHA)
    args = p.parse_args(argv)
    design = Design(args.warm_starts, args.seeds, args.margin, args.alpha, reg.family_sizes())
    try:
        print(report(args.results, design))
    except ValueError as err:
        p.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
