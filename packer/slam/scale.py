"""Metric scale by visual-inertial alignment: least squares over IMU preintegration.

Between scale keyframes i and j (frame clock t_i < t_j, dt = t_j - t_i), with the
IMU at the camera centre, R_wi = R_wc @ R_ic^T, SfM centres p (arbitrary units) and
metric velocities v:

    s (p_j - p_i) - v_i dt - 1/2 g dt^2 + R_wi_i J_p b  =  R_wi_i dP_ij
    v_j - v_i      - g dt            + R_wi_i J_v b  =  R_wi_i dV_ij

dP, dV are the accelerometer samples in [t_i + offset, t_j + offset] (IMU clock)
integrated in the IMU frame of keyframe i, rotated sample by sample with the
bias-corrected gyro; J_p, J_v their derivatives w.r.t. a constant accelerometer bias
b. Unknowns: scale s, every keyframe velocity, gravity g in the SfM frame (raw
accelerometer only: with gravity-removed accel there is none), optionally b. The
system is linear; the |g| = 9.80665 constraint is enforced afterwards by
Gauss-Newton on the gravity direction. Rows are divided by dt^2 and dt so every
residual is an acceleration (m/s^2).

Intervals span `interval` seconds (0.2 s: long enough that SfM position jitter,
amplified by 1/dt^2, stays small) and start at every registered keyframe, so all
the SfM data is used. The velocities are eliminated per block of intervals (a
projection), which keeps a long session to many small solves; the covariance of s
is inflated by the overlap factor since overlapping rows share data.

Accel sign conventions differ between platforms (CoreMotion reports minus the
specific force); a flipped sign flips every unknown, so a negative s is read as the
convention and recorded, never as a reflection of the trajectory.

The solve refuses (ScaleRefused, with the reason) when the motion does not make the
scale observable: too little acceleration, too few intervals, or a scale whose
standard deviation is too large a fraction of itself."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.slam.rotations import so3_exp

GRAVITY = 9.80665
CHUNK = 100  # intervals per velocity-elimination block (20 s at 0.2 s)


class ScaleRefused(ValueError):
    """The data does not determine the scale; str() is the reason for the user."""


@dataclass
class ScaleOptions:
    accel_mode: str = "auto"  # "auto" | "removed" (userAcceleration) | "raw" (with gravity)
    accel_bias: bool = True  # also estimate a constant accelerometer bias (phones have ~0.01 g)
    interval: float = 0.2  # seconds spanned by one preintegration interval
    overlapping: bool = True  # an interval from every keyframe (False: chained, disjoint)
    max_gap: float = 1.0  # longer spans between registered keyframes are not used
    min_intervals: int = 5  # disjoint intervals (1 s of registered video at 0.2 s)
    min_excitation: float = 0.1  # m/s^2 RMS motion acceleration
    max_rel_std: float = 0.02  # refuse when std(s)/s is larger
    min_explained: float = 0.5  # refuse when scaled SfM explains less of the IMU signal


@dataclass
class ScaleResult:
    scale: float  # metres per SfM unit
    rel_std: float  # std(s) / s from the least-squares covariance
    residual: float  # RMS residual, m/s^2
    excitation: float  # RMS motion acceleration seen by the IMU, m/s^2
    explained: float  # 1 - SSR / SSR(s = 0): how much of the IMU signal the SfM explains
    condition: float  # condition number of the column-normalised design matrix
    confidence: float  # 0..1, from rel_std against its threshold
    accel_mode: str
    accel_sign: float  # +1, or -1 when the accelerometer reports minus the acceleration
    gravity: list[float] | None  # in the SfM frame (m/s^2), raw mode only
    accel_bias: list[float] | None
    n_intervals: int


@dataclass
class Preintegrated:
    dR: np.ndarray  # (3,3) IMU rotation over the interval
    dV: np.ndarray  # (3,) m/s, IMU frame at the start
    dP: np.ndarray  # (3,) m
    Jv: np.ndarray  # (3,3) d dV / d bias (sign: dV(b) = dV - Jv b)
    Jp: np.ndarray  # (3,3)


def _interp_rows(t: float | np.ndarray, ts: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.stack([np.interp(t, ts, x[:, i]) for i in range(x.shape[1])], axis=-1)


def preintegrate(
    imu_t: np.ndarray, accel: np.ndarray, gyro: np.ndarray, t0: float, t1: float
) -> Preintegrated:
    """Integrate accel (m/s^2, IMU frame) and gyro (rad/s, bias-corrected) over
    [t0, t1] (IMU clock), endpoints linearly interpolated; trapezoid in the rotating
    frame, rotation by the midpoint gyro."""
    inner = np.nonzero((imu_t > t0) & (imu_t < t1))[0]
    ts = np.concatenate([[t0], imu_t[inner], [t1]])
    acc = np.vstack([_interp_rows(t0, imu_t, accel)[None], accel[inner], _interp_rows(t1, imu_t, accel)[None]])
    gyr = np.vstack([_interp_rows(t0, imu_t, gyro)[None], gyro[inner], _interp_rows(t1, imu_t, gyro)[None]])
    h = np.diff(ts)
    steps = so3_exp(0.5 * (gyr[1:] + gyr[:-1]) * h[:, None])
    R = np.eye(3)
    dV = np.zeros(3)
    dP = np.zeros(3)
    Jv = np.zeros((3, 3))
    Jp = np.zeros((3, 3))
    for k in range(len(h)):
        R1 = R @ steps[k]
        a_mean = 0.5 * (R @ acc[k] + R1 @ acc[k + 1])
        R_mean = 0.5 * (R + R1)
        dP = dP + dV * h[k] + 0.5 * a_mean * h[k] ** 2
        Jp = Jp + Jv * h[k] + 0.5 * R_mean * h[k] ** 2
        dV = dV + a_mean * h[k]
        Jv = Jv + R_mean * h[k]
        R = R1
    return Preintegrated(R, dV, dP, Jv, Jp)


def detect_accel_mode(accel_g: np.ndarray) -> str:
    """'raw' when the accelerometer carries gravity (median norm near 1 g), else 'removed'."""
    return "raw" if float(np.median(np.linalg.norm(accel_g, axis=1))) > 0.5 else "removed"


def scale_pairs(key_ts: np.ndarray, interval: float, max_gap: float, overlapping: bool = True) -> list[tuple[int, int]]:
    """Keyframe pairs (i, j) at least `interval` s apart (the first such j), at most
    `max_gap` s apart (a longer span crosses unregistered frames). Long intervals
    average the SfM position jitter down, which the 1/dt^2 rows amplify; with
    `overlapping` every keyframe starts an interval (all the SfM data is used, the
    velocity unknowns are shared), else they are chained end to end."""
    key_ts = np.asarray(key_ts, dtype=np.float64)
    js = np.searchsorted(key_ts, key_ts + interval - 1e-9, side="left")
    pairs = []
    i = 0
    while i < len(key_ts):
        j = int(js[i])
        if j >= len(key_ts):
            break
        if key_ts[j] - key_ts[i] <= max_gap:
            pairs.append((i, j))
            i = i + 1 if overlapping else j
        else:
            i += 1
    return pairs


def _tangent_basis(g: np.ndarray) -> np.ndarray:
    u = g / np.linalg.norm(g)
    a = np.array([1.0, 0.0, 0.0]) if abs(u[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    e1 = np.cross(u, a)
    e1 /= np.linalg.norm(e1)
    return np.stack([e1, np.cross(u, e1)], axis=1)  # (3,2)


@dataclass(frozen=True)
class _Layout:
    """Columns of the global unknowns: s first, then g (raw accelerometer only),
    then the accelerometer bias b (optional)."""

    ng: int  # number of global columns
    col_g: int | None
    col_b: int | None

    @classmethod
    def of(cls, mode: str, accel_bias: bool) -> _Layout:
        raw = mode == "raw"
        return cls(1 + (3 if raw else 0) + (3 if accel_bias else 0), 1 if raw else None,
                   1 + (3 if raw else 0) if accel_bias else None)


@dataclass(frozen=True)
class _Data:
    """The solve's inputs, converted once: keyframes on the frame clock, IMU on its
    own clock (t = frame time + offset), accel in m/s^2, gyro bias-corrected."""

    key_ts: np.ndarray
    positions: np.ndarray
    R_wc: np.ndarray
    R_ci: np.ndarray
    imu_t: np.ndarray
    acc: np.ndarray
    gyr: np.ndarray
    offset: float

    def covered_pairs(self, opt: ScaleOptions, overlapping: bool) -> list[tuple[int, int]]:
        """`scale_pairs` whose interval lies inside the IMU recording."""
        return [
            (i, j) for i, j in scale_pairs(self.key_ts, opt.interval, opt.max_gap, overlapping)
            if self.key_ts[i] + self.offset >= self.imu_t[0] and self.key_ts[j] + self.offset <= self.imu_t[-1]
        ]


def _interval_rows(
    d: _Data, i: int, j: int, r: int, vi: int, vj: int, lay: _Layout, Av: np.ndarray, Ag: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Fill the 6 rows of interval (i, j) (row block r, velocity columns vi, vj) and
    return its world-frame mean specific force (for the excitation)."""
    dt = d.key_ts[j] - d.key_ts[i]
    pre = preintegrate(d.imu_t, d.acc, d.gyr, d.key_ts[i] + d.offset, d.key_ts[j] + d.offset)
    Rw = d.R_wc[i] @ d.R_ci
    wp, wv = 1.0 / dt**2, 1.0 / dt
    rp, rv = slice(6 * r, 6 * r + 3), slice(6 * r + 3, 6 * r + 6)
    Ag[rp, 0] = (d.positions[j] - d.positions[i]) * wp
    Av[rp, vi:vi + 3] = -np.eye(3) * dt * wp
    Av[rv, vi:vi + 3] = -np.eye(3) * wv
    Av[rv, vj:vj + 3] = np.eye(3) * wv
    if lay.col_g is not None:
        Ag[rp, lay.col_g:lay.col_g + 3] = -0.5 * np.eye(3) * dt**2 * wp
        Ag[rv, lay.col_g:lay.col_g + 3] = -np.eye(3) * dt * wv
    if lay.col_b is not None:
        Ag[rp, lay.col_b:lay.col_b + 3] = Rw @ pre.Jp * wp
        Ag[rv, lay.col_b:lay.col_b + 3] = Rw @ pre.Jv * wv
    y[rp] = Rw @ pre.dP * wp
    y[rv] = Rw @ pre.dV * wv
    return Rw @ pre.dV / dt


def _reduced_system(
    d: _Data, pairs: list[tuple[int, int]], lay: _Layout
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(A, y, motion, n_vel): the rows of every interval with the keyframe velocities
    eliminated chunk by chunk (projection onto the orthogonal complement of their
    columns), so a 10-minute session costs many small solves, not one huge one.
    motion: (len(pairs), 3) world-frame mean specific force per interval; n_vel:
    velocity unknowns eliminated (for the degrees of freedom)."""
    G_rows: list[np.ndarray] = []
    y_rows: list[np.ndarray] = []
    motion = np.zeros((len(pairs), 3))  # world-frame mean specific force per interval
    n_vel = 0
    for c0 in range(0, len(pairs), CHUNK):
        chunk = pairs[c0:c0 + CHUNK]
        used = sorted({k for p in chunk for k in p})
        vidx = {k: n for n, k in enumerate(used)}
        Av = np.zeros((6 * len(chunk), 3 * len(used)))
        Ag = np.zeros((6 * len(chunk), lay.ng))
        y = np.zeros(6 * len(chunk))
        for r, (i, j) in enumerate(chunk):
            motion[c0 + r] = _interval_rows(d, i, j, r, 3 * vidx[i], 3 * vidx[j], lay, Av, Ag, y)
        rhs = np.column_stack([Ag, y])
        proj = rhs - Av @ _lstsq(Av, rhs)
        G_rows.append(proj[:, :-1])
        y_rows.append(proj[:, -1])
        n_vel += Av.shape[1]
    return np.vstack(G_rows), np.concatenate(y_rows), motion, n_vel


def _fit(
    A: np.ndarray, y: np.ndarray, motion: np.ndarray, n_vel: int, n_eff: int, lay: _Layout, mode: str,
    opt: ScaleOptions,
) -> ScaleResult:
    """Least squares on the reduced system, the sign convention, |g| refinement, and
    the statistics the refusal checks read (rel_std, explained, excitation)."""
    m = len(motion)
    x = _lstsq(A, y)
    sign = 1.0
    if x[0] < 0:  # the accelerometer reports minus the acceleration: flip the data
        sign = -1.0
        y = -y
        x = -x
    col_g, col_b = lay.col_g, lay.col_b
    if col_g is not None:
        x = _refine_gravity(A, y, x, col_g)
    res = A @ x - y
    dof = max(len(y) - lay.ng - n_vel, 1)
    sigma2 = float(res @ res) / dof
    colnorm = np.linalg.norm(A, axis=0)
    colnorm[colnorm == 0] = 1.0
    sv = np.linalg.svd(A / colnorm, compute_uv=False)
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    var_s = _marginal_variance(A, 0) * sigma2
    s = float(x[0])
    # rows of overlapping intervals are correlated; inflate the i.i.d. estimate accordingly
    var_s *= max(1.0, m / max(n_eff, 1))
    rel_std = float(np.sqrt(var_s) / s) if s > 0 else float("inf")
    # how much of the IMU signal the scaled SfM motion explains, against s = 0
    if lay.ng > 1:
        x0 = _lstsq(A[:, 1:], y)
        ssr0 = float(np.sum((A[:, 1:] @ x0 - y) ** 2))
    else:
        ssr0 = float(y @ y)
    explained = 1.0 - float(res @ res) / ssr0 if ssr0 > 0 else 0.0
    g_vec = x[col_g:col_g + 3] if col_g is not None else np.zeros(3)
    excitation = float(np.sqrt(np.mean(np.sum((sign * motion + g_vec) ** 2, axis=1))))
    confidence = float(np.clip(1.0 - rel_std / opt.max_rel_std, 0.0, 1.0)) if np.isfinite(rel_std) else 0.0
    return ScaleResult(
        scale=s,
        rel_std=rel_std,
        residual=float(np.sqrt(float(res @ res) / max(len(y) - n_vel, 1) * 3.0)),
        excitation=excitation,
        explained=explained,
        condition=cond,
        confidence=confidence,
        accel_mode=mode,
        accel_sign=sign,
        gravity=[float(v) for v in g_vec] if col_g is not None else None,
        accel_bias=[float(v) for v in x[col_b:col_b + 3]] if col_b is not None else None,
        n_intervals=m,
    )


def solve_scale(
    key_ts: np.ndarray,
    positions: np.ndarray,
    R_wc: np.ndarray,
    imu_t: np.ndarray,
    accel_g: np.ndarray,
    gyro: np.ndarray,
    *,
    offset: float,
    R_ic: np.ndarray,
    gyro_bias: np.ndarray | None = None,
    options: ScaleOptions | None = None,
) -> ScaleResult:
    """Metric scale of an SfM trajectory from the IMU (see the module docstring).

    key_ts: registered keyframe times (frame clock); positions / R_wc: their SfM
    camera centres and camera-to-world rotations; accel_g in g (IMU frame), gyro in
    rad/s; offset / R_ic / gyro_bias from `align_imu`. Raises ScaleRefused."""
    opt = options or ScaleOptions()
    key_ts = np.asarray(key_ts, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    R_wc = np.asarray(R_wc, dtype=np.float64)
    mode = detect_accel_mode(accel_g) if opt.accel_mode == "auto" else opt.accel_mode
    if mode not in ("raw", "removed"):
        raise ValueError(f"accel_mode must be auto, raw or removed, got {opt.accel_mode!r}")
    d = _Data(
        key_ts=key_ts,
        positions=positions,
        R_wc=R_wc,
        R_ci=np.asarray(R_ic).T,
        imu_t=imu_t,
        acc=np.asarray(accel_g, dtype=np.float64) * GRAVITY,
        gyr=np.asarray(gyro, dtype=np.float64) - (0.0 if gyro_bias is None else np.asarray(gyro_bias)),
        offset=offset,
    )
    pairs = d.covered_pairs(opt, opt.overlapping)
    # overlapping intervals share data: count (and weigh uncertainty by) disjoint ones
    n_eff = len(d.covered_pairs(opt, overlapping=False))
    if n_eff < opt.min_intervals:
        raise ScaleRefused(
            f"only {n_eff} keyframe intervals of {opt.interval:g} s with IMU coverage; "
            f"need {opt.min_intervals} (longer session or more registered frames)"
        )
    # Global unknowns: s, g (raw only), b (optional). Keyframe velocities are local
    # and eliminated per chunk (`_reduced_system`).
    lay = _Layout.of(mode, opt.accel_bias)
    A, y, motion, n_vel = _reduced_system(d, pairs, lay)
    result = _fit(A, y, motion, n_vel, n_eff, lay, mode, opt)
    _check(result, opt)
    return result


def _check(r: ScaleResult, opt: ScaleOptions) -> None:
    """Refuse with the first reason that applies (most basic first)."""
    if r.excitation < opt.min_excitation:
        raise ScaleRefused(
            f"scale not observable: the IMU sees only {r.excitation:.3f} m/s^2 RMS motion acceleration "
            f"(need >= {opt.min_excitation:g}); the camera barely translates. Move the gripper through "
            "space while recording, or use --scale marker / known-distance"
        )
    if not (r.scale > 0) or r.explained < opt.min_explained:
        raise ScaleRefused(
            f"scale not observable: the SfM motion explains only {max(r.explained, 0.0):.0%} of the IMU "
            f"acceleration (need {opt.min_explained:.0%}): the reconstruction is distorted (try the default "
            "--mapper global or a smaller --keyframe-step) or imu.json belongs to another recording"
        )
    if r.rel_std > opt.max_rel_std:
        raise ScaleRefused(
            f"scale poorly constrained: {r.scale:.4g} +- {r.rel_std:.1%} (need <= {opt.max_rel_std:.0%}); "
            "record with more translation or use --scale marker / known-distance"
        )


def _lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(A, y, rcond=None)[0]


def _marginal_variance(A: np.ndarray, col: int) -> float:
    """[(A^T A)^-1]_{col,col} without forming the inverse: 1 / |residual of column
    `col` regressed on the other columns|^2 (Schur complement)."""
    others = np.delete(A, col, axis=1)
    c = A[:, col]
    coef = _lstsq(others, c)
    r = c - others @ coef
    d = float(r @ r)
    return 1.0 / d if d > 0 else float("inf")


def _refine_gravity(A: np.ndarray, y: np.ndarray, x: np.ndarray, col_g: int, iters: int = 5) -> np.ndarray:
    """Re-solve with |g| = GRAVITY: g = G * unit(g0 + B w), linear in w per step."""
    x = x.copy()
    g = x[col_g:col_g + 3]
    if np.linalg.norm(g) < 1e-6:
        return x
    g = g / np.linalg.norm(g) * GRAVITY
    keep = [c for c in range(A.shape[1]) if not (col_g <= c < col_g + 3)]
    Ag = A[:, col_g:col_g + 3]
    for _ in range(iters):
        B = _tangent_basis(g) * GRAVITY
        M = np.hstack([A[:, keep], Ag @ B])
        z = _lstsq(M, y - Ag @ g)
        w = z[-2:]
        g = g + B @ w
        g = g / np.linalg.norm(g) * GRAVITY
        x[keep] = z[:-2]
    x[col_g:col_g + 3] = g
    return x
