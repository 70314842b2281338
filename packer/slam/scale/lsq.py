"""Least-squares helpers of the scale solve (`packer.slam.scale.scale`): plain, with a
noisy regressor column corrected (errors in variables), and one unknown's marginal
variance, none forming an inverse."""
from __future__ import annotations

import numpy as np


def lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(A, y, rcond=None)[0]


def lstsq_eiv(A: np.ndarray, y: np.ndarray, d0: float) -> np.ndarray:
    """Least squares when column 0 carries noise of known total energy d0 (the
    accelerometer noise, double integrated): (A^T A - d0 e0 e0^T) x = A^T y, the
    corrected least squares that undoes the attenuation towards 0 plain least
    squares has (k too small: +0.4% on s for a weak 6 s session). Plain least
    squares when the noise would take most of the column's information."""
    c = np.linalg.norm(A, axis=0)
    c[c == 0] = 1.0
    An = A / c
    if not 0 < d0 / c[0] ** 2 < 0.5 / marginal_variance(An, 0):
        return lstsq(A, y)
    N = An.T @ An
    N[0, 0] -= d0 / c[0] ** 2
    return np.linalg.lstsq(N, An.T @ y, rcond=None)[0] / c


def marginal_variance(A: np.ndarray, col: int) -> float:
    """[(A^T A)^-1]_{col,col} without forming the inverse: 1 / |residual of column
    `col` regressed on the other columns|^2 (Schur complement)."""
    others = np.delete(A, col, axis=1)
    c = A[:, col]
    r = c - others @ lstsq(others, c) if others.shape[1] else c
    d = float(r @ r)
    return 1.0 / d if d > 0 else float("inf")
