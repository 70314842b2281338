"""Does one scale fit the whole SfM path? The statistics `packer.slam.scale.scale` reads off
its reduced system (whitened rows, each window's start position and velocity projected
out; a window's rows axis-major) to inflate the std or refuse: how much of what each
window's IMU explains the common fit reproduces, and how far the windows' own scales, or
a free symmetric 3x3 scale per window, scatter about the one scale beyond the noise.

Kept apart from the solve because each is a pure function of (G, y, blocks) and the
solve reads as "fit, then check"."""
from __future__ import annotations

import numpy as np

from packer.slam.scale.lsq import lstsq


def explained(G: np.ndarray, y: np.ndarray, res: np.ndarray, blocks: list[slice]) -> float:
    """1 - sum |P_w r_w|^2 / sum |P_w y_w|^2, P_w the projection on window w's own
    global columns: how much of what each window's IMU could explain on its own the
    one common scale (and bias, gravity) does explain. Jitter enters both sums only
    through a few columns per window, so a long noisy session is not mistaken for a
    mismatch, while a distorted reconstruction or another recording's IMU is."""
    num = den = 0.0
    for b in blocks:
        Gb = G[b]
        num += float(np.sum((Gb @ lstsq(Gb, res[b])) ** 2))
        den += float(np.sum((Gb @ lstsq(Gb, y[b])) ** 2))
    return 1.0 - num / den if den > 0 else 0.0


def window_spread(
    G: np.ndarray, y: np.ndarray, x: np.ndarray, blocks: list[slice], n_b: int, g: np.ndarray, sigma2: float
) -> float:
    """chi^2 / dof of each window's own scale (bias and gravity held at the common
    fit) about the common one; about 1 when the windows differ only by the noise.
    Above 1 the SfM scale is not the same all along (scale drift between parts of
    the reconstruction) and the std of s is inflated by its square root (the
    Birge ratio), so it covers what the noise model does not. 1.0 below 3 windows."""
    if len(blocks) < 3 or not x[0] > 0:
        return 1.0
    col = G[:, 0] + (G[:, 1 + n_b:] @ g if G.shape[1] > 1 + n_b else 0.0)
    r = y - G[:, 1:1 + n_b] @ x[1:1 + n_b]
    chi2 = 0.0
    for b in blocks:
        w = float(col[b] @ col[b])
        if w > 0:
            chi2 += (float(col[b] @ r[b]) / w - x[0]) ** 2 * w / sigma2
    return chi2 / (len(blocks) - 1)


_PAIRS = [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)]


def _shape_columns(G: np.ndarray, blocks: list[slice]) -> np.ndarray:
    """k's column split into a symmetric 3x3 per window: K_ab's column carries the IMU's
    axis-b double integral in the rows of axis a (and a's in b's). A block's rows are
    axis-major (x rows, y rows, z rows; whitening and the q0, u0 projection act per axis
    alike), so an axis's column is a slice of k's."""
    col = G[:, 0]
    out = np.zeros((len(col), 6 * len(blocks)))
    for w, b in enumerate(blocks):
        n = (b.stop - b.start) // 3
        ax = [slice(b.start + a * n, b.start + (a + 1) * n) for a in range(3)]
        for j, (a, c) in enumerate(_PAIRS):
            out[ax[a], 6 * w + j] = col[ax[c]]
            if a != c:
                out[ax[c], 6 * w + j] = col[ax[a]]
    return out


def shape_spread(G: np.ndarray, y: np.ndarray, blocks: list[slice], dof: int) -> float:
    """chi^2/dof of a free symmetric 3x3 scale per window against the one common scale
    (bias and gravity free in both): about 1 when the SfM path is a similarity of the
    IMU's. Above 1 the reconstruction is stretched along some direction (depth against
    the lateral axes, where a hand sweeps 0.2 m before a room metres away) or its scale
    changes within the session, so the one scale, which weighs the axes and windows by
    the acceleration the IMU saw there, differs from the path's best similarity by more
    than the noise: the std is inflated by the square root, as for `window_spread`. The
    extra sum of squares of the larger model (an F statistic), so it also works with one
    or two windows, where the windows' own scales cannot be compared."""
    rest = G[:, 1:]
    full = np.column_stack([_shape_columns(G, blocks), rest])
    extra = full.shape[1] - G.shape[1]
    resid_dof = dof - full.shape[1]
    if extra <= 0 or resid_dof <= 0:
        return 1.0
    rss_c = float(np.sum((y - G @ lstsq(G, y)) ** 2))
    rss_f = float(np.sum((y - full @ lstsq(full, y)) ** 2))
    if rss_f <= 0:
        return 1.0
    return max(rss_c - rss_f, 0.0) / extra / (rss_f / resid_dof)


def lever_significance(M: np.ndarray, x: np.ndarray, col: int, n_r: int, var: float
                       ) -> tuple[list[float] | None, float]:
    """(r in metres, chi^2 of k r against 0 on its covariance) of the lever-arm columns
    `col`..`col + n_r` of the design M (x: the solution, k = x[0]); (None, 0) without."""
    if not n_r or not x[0] > 0:
        return None, 0.0
    kr = x[col:col + n_r]
    N = M.T @ M
    try:
        cov = np.linalg.inv(N)[col:col + n_r, col:col + n_r] * var
        chi2 = float(kr @ np.linalg.solve(cov, kr))
    except np.linalg.LinAlgError:
        return None, 0.0
    return [float(v) for v in kr / x[0]], chi2
