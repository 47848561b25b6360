"""Quadrature rules of integrated gradients: where on the path from the baseline to the input the
gradient is taken (``alphas`` in [0, 1]) and how much each point weighs (summing to 1)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import HookscopeError, did_you_mean

__all__ = ["RULES", "rule_name", "rule_points"]

Points = tuple[list[float], list[float]]  # (alphas, weights)


def _left(n: int) -> Points:
    return [i / n for i in range(n)], [1 / n] * n


def _right(n: int) -> Points:
    return [(i + 1) / n for i in range(n)], [1 / n] * n


def _middle(n: int) -> Points:
    return [(i + 0.5) / n for i in range(n)], [1 / n] * n


def _trapezoid(n: int) -> Points:
    # n points 1 / (n - 1) apart, the two ends half-weighted: the weights sum to 1
    h = 1 / (n - 1)
    return [i * h for i in range(n)], [h / 2] + [h] * (n - 2) + [h / 2]


def _gauss_legendre(n: int) -> Points:
    x, w = np.polynomial.legendre.leggauss(n)
    return [float(v) for v in 0.5 * (1 + x)], [float(v) for v in 0.5 * w]


RULES: dict[str, tuple[Callable[[int], Points], int]] = {  # rule -> (its points, the fewest steps)
    "riemann_left": (_left, 1),
    "riemann_right": (_right, 1),
    "riemann_middle": (_middle, 1),
    "riemann_trapezoid": (_trapezoid, 2),
    "gausslegendre": (_gauss_legendre, 1),
}


def rule_name(rule: str) -> str:
    """The rule's name as :data:`RULES` spells it (``"gauss-legendre"`` is ``"gausslegendre"``).

    Example:
        >>> rule_name("Gauss-Legendre"), rule_name("riemann-left")
        ('gausslegendre', 'riemann_left')
    """
    key = rule.lower().replace("-", "_") if isinstance(rule, str) else ""
    key = "gausslegendre" if key == "gauss_legendre" else key
    if key not in RULES:
        raise HookscopeError(f"rule={rule!r} is not an integration rule.{did_you_mean(str(rule), RULES)} "
                             f"Use one of {', '.join(RULES)}")
    return key


def rule_points(rule: str, steps: int) -> Points:
    """``(alphas, weights)`` of ``steps`` points of a rule.

    Example:
        >>> rule_points("riemann_trapezoid", 3)
        ([0.0, 0.5, 1.0], [0.25, 0.5, 0.25])
    """
    key = rule_name(rule)
    points, fewest = RULES[key]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < fewest:
        raise HookscopeError(f"steps={steps!r} is too few for rule={key!r}; pass an int >= {fewest}")
    return points(steps)
