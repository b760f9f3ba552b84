"""Closed-form theory of speculative decoding (Leviathan, Kalman & Matias, 2023).

Pure-numpy implementations of the quantities of Section 3 of *Fast Inference from
Transformers via Speculative Decoding* (ICML 2023), with the paper's names:

==============================  =====================================================
paper                           here
==============================  =====================================================
Definition 1 / Theorem 5        :func:`beta`            β = Σ_x min(p(x), q(x))
Definition 2 / Lemma 3          :func:`total_variation` D_LK(p, q) = ½ Σ_x |p − q|
Corollary 6                     :func:`alpha_from_betas` α = E(β)
Equation (1)                    :func:`expected_tokens_per_call`
Theorem 8 (a.k.a. 3.8)          :func:`walltime_improvement`
Corollary 9                     ``walltime_improvement(alpha, 1, c) == (1+α)/(1+c)``
Theorem 10 (a.k.a. 3.10)        :func:`operations_factor`
Section 3.5 ("optimal γ")       :func:`optimal_gamma`
Section 3.6 (negligible cost)   :func:`improvement_bound_zero_cost`
Appendix A.5 (lenience)         :func:`lenient_alpha`
Table 1                         :func:`table1`
(our extension)                 :func:`walltime_improvement_measured`
(our extension, beam search)    :func:`beam_walltime_improvement`
==============================  =====================================================

Conventions
-----------
* ``alpha`` is the expected acceptance rate, in [0, 1].  Values within ``1e-6``
  outside the interval (float32 round-off in Σ min(p, q)) are clipped; anything
  further out raises :class:`ValueError`.
* ``gamma`` (γ) is the number of drafter tokens per iteration, an integer ≥ 1.
  Integer-valued floats (``3.0``) are accepted; ``2.5``, ``0``, ``True`` are not.
* ``c`` is the cost coefficient (Definition 7): time of one drafter step divided by
  the time of one target step; ``c ≥ 0``.  ``c_hat`` (ĉ) is the analogous ratio of
  arithmetic operations per token.
* The numeric functions broadcast over array inputs; 0-d results are returned as
  Python ``float``.
* All formulas rest on the paper's simplifying assumptions: the per-position
  acceptance probabilities β are i.i.d. (so the tokens per target call are a capped
  geometric variable), γ + 1 parallel target positions cost the same walltime as one
  (Section 3.4: enough spare compute), and generations are long.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

__all__ = [
    "beta",
    "total_variation",
    "alpha_from_betas",
    "expected_tokens_per_call",
    "walltime_improvement",
    "walltime_improvement_measured",
    "beam_walltime_improvement",
    "operations_factor",
    "optimal_gamma",
    "PROJECTION_ALPHAS",
    "OptimalGamma",
    "improvement_bound_zero_cost",
    "lenient_alpha",
    "table1",
    "Table1Row",
    "TABLE1_SETTINGS",
]

#: Slack allowed when checking that alpha lies in [0, 1] (values inside the slack
#: are clipped).  Σ_x min(p, q) of two identical float32 softmaxes can be 1 + 1e-7.
_ALPHA_ATOL = 1e-6

#: (α, γ) pairs of the paper's Table 1 (c = ĉ = 0).
TABLE1_SETTINGS: tuple[tuple[float, int], ...] = (
    (0.6, 2),
    (0.7, 3),
    (0.8, 2),
    (0.8, 5),
    (0.9, 2),
    (0.9, 10),
)


# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
#: The acceptance rates a projection evaluates when none is measured (`costs.projections`,
#: `plan.speedup_projection`).
PROJECTION_ALPHAS = (0.6, 0.7, 0.8, 0.9)


def _scalar_or_array(x: np.ndarray):
    x = np.asarray(x)
    return float(x) if x.ndim == 0 else x


def _check_alpha(alpha, name: str = "alpha") -> np.ndarray:
    try:
        a = np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be a number or array of numbers in [0, 1], got {alpha!r}") from exc
    if np.any(np.isnan(a)):
        raise ValueError(f"{name} must be in [0, 1], got NaN")
    if np.any(a < -_ALPHA_ATOL) or np.any(a > 1.0 + _ALPHA_ATOL):
        bad = a[(a < -_ALPHA_ATOL) | (a > 1.0 + _ALPHA_ATOL)].ravel()[0]
        raise ValueError(f"{name} must be in [0, 1] (an acceptance probability), got {bad!r}")
    return np.clip(a, 0.0, 1.0)


def _check_gamma(gamma, name: str = "gamma") -> np.ndarray:
    if isinstance(gamma, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= 1, got a bool ({gamma!r})")
    g = np.asarray(gamma)
    if g.dtype == np.bool_ or not (np.issubdtype(g.dtype, np.integer)
                                   or np.issubdtype(g.dtype, np.floating)):
        raise ValueError(f"{name} must be an integer >= 1, got {gamma!r}")
    if np.issubdtype(g.dtype, np.floating):
        if np.any(~np.isfinite(g)) or np.any(g != np.floor(g)):
            raise ValueError(
                f"{name} must be an integer >= 1 (number of draft tokens), got {gamma!r}")
    if np.any(g < 1):
        raise ValueError(f"{name} must be an integer >= 1 (number of draft tokens), got {gamma!r}")
    return g.astype(np.int64)


def _check_nonneg(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a non-negative number, got {x!r}") from exc
    if np.any(np.isnan(a)) or np.any(a < 0) or np.any(np.isinf(a)):
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")
    return a


def _check_distributions(p, q) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    try:
        np.broadcast_shapes(p.shape, q.shape)
    except ValueError as exc:
        raise ValueError(
            f"p and q must have broadcastable shapes, got {p.shape} and {q.shape}") from exc
    for name, d in (("p", p), ("q", q)):
        if not np.all(np.isfinite(d)):
            raise ValueError(f"{name} must contain finite probabilities")
        if np.any(d < 0):
            raise ValueError(f"{name} must contain non-negative probabilities")
    return p, q


# --------------------------------------------------------------------------- #
# acceptance rates
# --------------------------------------------------------------------------- #
def beta(p, q, axis: int = -1):
    """Acceptance probability β of one speculative-sampling step.

    Definition 1 / Theorem 5 of the paper::

        β = E_{x~q} min(1, p(x)/q(x)) = Σ_x min(p(x), q(x)) = 1 − D_LK(p, q)

    where ``p`` is the target distribution p(x_t | x_<t) and ``q`` the drafter
    distribution q(x_t | x_<t) for the same prefix.  The sum is over ``axis`` (the
    vocabulary); leading axes (batch, positions) are kept, so a ``[T, V]`` pair gives
    the ``[T]`` per-position β's that :func:`alpha_from_betas` averages.

    Inputs should be normalised probability vectors (not logits); they are cast to
    float64 but normalisation is not enforced.
    """
    p, q = _check_distributions(p, q)
    return _scalar_or_array(np.sum(np.minimum(p, q), axis=axis))


def total_variation(p, q, axis: int = -1):
    """Total-variation distance, the paper's divergence D_LK (Definition 2, Lemma 3).

    ``D_LK(p, q) = Σ_x |p(x) − M(x)| = ½ Σ_x |p(x) − q(x)| = 1 − Σ_x min(p(x), q(x))``
    with ``M = (p + q)/2``.  Symmetric, in [0, 1], zero iff p = q and one iff the
    supports are disjoint (Corollary 4).  For normalised inputs
    ``total_variation(p, q) == 1 - beta(p, q)`` (Theorem 5).
    """
    p, q = _check_distributions(p, q)
    return _scalar_or_array(0.5 * np.sum(np.abs(p - q), axis=axis))


def alpha_from_betas(betas, axis=None):
    """α = E(β) (Corollary 6): the mean of per-position acceptance probabilities.

    The paper estimates α offline by scoring 10K tokens generated by M_p with both
    models and averaging ``beta`` over positions.  ``axis=None`` averages everything.
    Raises ``ValueError`` for an empty input or β's outside [0, 1].
    """
    b = np.asarray(betas, dtype=np.float64)
    if b.size == 0:
        raise ValueError("betas must be non-empty")
    b = _check_alpha(b, name="betas")
    return _scalar_or_array(np.mean(b, axis=axis))


def lenient_alpha(p, q, l, axis: int = -1):  # noqa: E741 (the paper's lenience l)
    """Acceptance probability with lenience ``l`` (Appendix A.5; lossy, opt-in).

    With the drafter probability scaled by ``l`` before the comparison (accept x ~ q
    if ``r < p(x) / (l q(x))``)::

        α_l = E_{x~q} p(x) / max(p(x), l q(x)) = (1/l) Σ_x min(p(x), l q(x))
            = Σ_x min(p(x)/l, q(x))

    ``l = 1`` is exact speculative sampling (``== beta(p, q)``); smaller ``l``
    raises acceptance but changes the output distribution (no token is sampled with
    probability above ``p(x)/l``).  Like :func:`beta` this is the per-prefix value
    (summed over ``axis``); average over positions with :func:`alpha_from_betas`.
    The paper writes ``l ∈ [0, 1]``; ``l = 0`` is undefined here, so ``l ∈ (0, 1]``.
    """
    p, q = _check_distributions(p, q)
    l_arr = np.asarray(l, dtype=np.float64)
    if np.any(~np.isfinite(l_arr)) or np.any(l_arr <= 0) or np.any(l_arr > 1):
        raise ValueError(f"lenience l must be in (0, 1], got {l!r}")
    return _scalar_or_array(np.sum(np.minimum(p / l_arr, q), axis=axis))


# --------------------------------------------------------------------------- #
# tokens per call, walltime, operations
# --------------------------------------------------------------------------- #
def _expected_tokens(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Equation (1) on validated arrays, numerically stable as α → 1.

    ``(1 − α^{γ+1}) / (1 − α)`` is evaluated as ``−expm1((γ+1) log α) / (1 − α)``
    (no cancellation near α = 1; ``1 − α`` is exact there), and α = 1 returns the
    limit γ + 1 exactly.
    """
    a, g = np.broadcast_arrays(a, g)
    one_minus = 1.0 - a
    with np.errstate(divide="ignore", invalid="ignore"):
        val = -np.expm1((g + 1) * np.log(a)) / one_minus
    return np.where(one_minus > 0, val, (g + 1).astype(np.float64))


def expected_tokens_per_call(alpha, gamma):
    """Expected tokens produced by one run of Algorithm 1, Equation (1).

    ``E(# generated tokens) = (1 − α^{γ+1}) / (1 − α)``

    the mean of a geometric variable with success (rejection) probability 1 − α
    capped at γ + 1: 1 + Σ_{k=1}^{γ} α^k.  This is also the reduction factor in the
    number of serial target-model calls.  The α → 1 limit γ + 1 is returned exactly;
    α = 0 gives 1.  Broadcasts over array ``alpha`` and ``gamma``.
    """
    return _scalar_or_array(_expected_tokens(_check_alpha(alpha), _check_gamma(gamma)))


def walltime_improvement(alpha, gamma, c):
    """Expected walltime improvement factor of Algorithm 1, Theorem 8 (3.8).

    ``(1 − α^{γ+1}) / ((1 − α)(γc + 1))``

    One iteration costs γ drafter steps (γcT) plus one target call (T, assumed the
    same for γ + 1 parallel positions as for one) and yields Equation (1) tokens.
    For γ = 1 this is (1 + α)/(1 + c) (Corollary 9).  Assumes long generations.
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    c = _check_nonneg(c, "c")
    return _scalar_or_array(_expected_tokens(a, g) / (g * c + 1.0))


def walltime_improvement_measured(alpha, gamma, c, verify_cost=1.0):
    """Walltime improvement when verification is not free (our extension).

    **Not in the paper.**  Theorem 8 assumes that scoring γ + 1 positions with M_p
    takes the same time as one ordinary decoding step.  Here one (γ+1)-token verifier
    call costs ``verify_cost`` times a one-token target call (both measured, e.g. on
    the actual hardware), and ``c`` is still drafter-step time / one-token target
    time, so::

        improvement = E / (γc + verify_cost),   E = (1 − α^{γ+1}) / (1 − α)

    ``verify_cost = 1`` recovers Theorem 8.  ``verify_cost`` must be > 0.
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    c = _check_nonneg(c, "c")
    v = _check_nonneg(verify_cost, "verify_cost")
    if np.any(v <= 0):
        raise ValueError(f"verify_cost must be > 0, got {verify_cost!r}")
    return _scalar_or_array(_expected_tokens(a, g) / (g * c + v))


def beam_walltime_improvement(steps_per_call, gamma, c, verify_cost=1.0):
    """Walltime improvement of exact speculative beam search over beam search (ours).

    **Not in the paper.**  Beam search (``sd.Beam``) makes one target call over its K
    beams per step; speculative beam search (``experimental.SpeculativeBeam``) makes per round γ
    drafter calls over the K beams (its own beam search, c each: drafter step / target
    step at the same K rows) and ONE target call over its M drafted chains of γ + 1
    tokens (``verify_cost`` times beam search's step), and commits ``steps_per_call``
    beam steps (measured: it depends on how often the drafter's tree holds T5X's next
    beams, not on one α)::

        improvement = steps_per_call / (γc + verify_cost)

    >>> round(beam_walltime_improvement(2.5, 3, 0.1, 1.2), 4)
    1.6667
    """
    s = np.asarray(steps_per_call, dtype=np.float64)
    if np.any(~np.isfinite(s)) or np.any(s < 1.0):
        raise ValueError(f"steps_per_call must be >= 1 (a round commits a step), got "
                         f"{steps_per_call!r}")
    g, c = _check_gamma(gamma), _check_nonneg(c, "c")
    v = _check_nonneg(verify_cost, "verify_cost")
    if np.any(v <= 0):
        raise ValueError(f"verify_cost must be > 0, got {verify_cost!r}")
    return _scalar_or_array(s / (g * c + v))


def operations_factor(alpha, gamma, c_hat):
    """Expected factor of increase in total arithmetic operations, Theorem 10 (3.10).

    ``(1 − α)(γĉ + γ + 1) / (1 − α^{γ+1})``

    One iteration costs γ drafter runs (γĉT̂) plus γ + 1 parallel target positions
    ((γ + 1)T̂) and yields Equation (1) tokens; rejected positions are wasted work.
    At α = 1 the value is (γĉ + γ + 1)/(γ + 1).
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    ch = _check_nonneg(c_hat, "c_hat")
    return _scalar_or_array((g * ch + g + 1.0) / _expected_tokens(a, g))


def improvement_bound_zero_cost(alpha):
    """Upper bound 1/(1 − α) on the improvement for negligible-cost drafters (c ≈ 0).

    Section 3.6: with c = 0 the improvement is (1 − α^{γ+1})/(1 − α) < 1/(1 − α),
    approached as γ → ∞ (e.g. n-gram / table-lookup drafts).  The same 1/(1 − α) is
    the tokens-per-call of the γ-oracle of Section 3.5.  Returns ``inf`` at α = 1.
    """
    a = _check_alpha(alpha)
    with np.errstate(divide="ignore"):
        return _scalar_or_array(np.where(a < 1.0, 1.0 / (1.0 - a), np.inf))


# --------------------------------------------------------------------------- #
# choosing gamma
# --------------------------------------------------------------------------- #
class OptimalGamma(NamedTuple):
    """Result of :func:`optimal_gamma`; unpacks as ``gamma, improvement``."""

    gamma: int
    improvement: float


def optimal_gamma(alpha, c, max_gamma: int = 64) -> OptimalGamma:
    """Integer γ in 1..max_gamma maximising Theorem 8's walltime improvement.

    Section 3.5: "Since γ is an integer, it can be easily found numerically" — this
    evaluates Theorem 8 for every γ in ``1..max_gamma`` and returns the argmax (the
    smallest γ on ties) together with its improvement factor.  ``alpha`` and ``c``
    are scalars.

    When α ≤ c no γ ≥ 1 gives an improvement (Corollary 9 and its proof: an
    improvement at some γ implies one at γ = 1, where the factor is (1+α)/(1+c)).
    The argmax is still returned, but its ``improvement`` is ≤ 1.0: callers should
    then fall back to ordinary decoding.  At α = 1, c = 0 the improvement grows
    without bound, so the result is ``max_gamma``.
    """
    a = _check_alpha(alpha)
    c_arr = _check_nonneg(c, "c")
    if a.ndim != 0 or c_arr.ndim != 0:
        raise ValueError("optimal_gamma takes scalar alpha and c")
    if (isinstance(max_gamma, (bool, np.bool_)) or not isinstance(max_gamma, numbers.Integral)
            or max_gamma < 1):
        raise ValueError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
    gammas = np.arange(1, int(max_gamma) + 1, dtype=np.int64)
    vals = _expected_tokens(a, gammas) / (gammas * c_arr + 1.0)
    i = int(np.argmax(vals))
    return OptimalGamma(gamma=int(gammas[i]), improvement=float(vals[i]))


# --------------------------------------------------------------------------- #
# Table 1
# --------------------------------------------------------------------------- #
class Table1Row(NamedTuple):
    """One row of Table 1: α, γ, operations factor, speed factor (c = ĉ = 0)."""

    alpha: float
    gamma: int
    ops: float
    speed: float


def table1() -> list[Table1Row]:
    """Reproduce the paper's Table 1 from the formulas (c = ĉ = 0), 2 decimals.

    ``ops`` is Theorem 10 with ĉ = 0, ``speed`` is Theorem 8 with c = 0; paper
    values: 0.6/2 → 1.53X/1.96X, 0.7/3 → 1.58X/2.53X, 0.8/2 → 1.23X/2.44X,
    0.8/5 → 1.63X/3.69X, 0.9/2 → 1.11X/2.71X, 0.9/10 → 1.60X/6.86X.
    """
    rows = []
    for a, g in TABLE1_SETTINGS:
        ops = operations_factor(a, g, 0.0)
        speed = walltime_improvement(a, g, 0.0)
        rows.append(Table1Row(alpha=a, gamma=g, ops=round(ops, 2), speed=round(speed, 2)))
    return rows
