"""Metric scale by visual-inertial alignment: SfM positions regressed on IMU double integrals.

With the IMU at the camera centre, the SfM centres p (arbitrary units) follow
p(t) = k x(t), k = 1/s, and the metric path x has x'' = R_w(t) (a(t) - b) + g: the
accelerometer a (IMU frame, bias b) rotated into the SfM world, plus gravity when the
accelerometer carries it ('raw'; the app's gravity-removed userAcceleration has
none, so g is not an unknown there). Over a window of keyframes (`window`, 4 s)
that integrates to

    p_j = q0 + u0 (t_j - t0) + k D(t_j) - J(t_j) (k b) + 1/2 (t_j - t0)^2 (k g)  + e_j

with D the double integral of R_w a and J that of R_w (the IMU alone); q0, u0 (the
window's start position and velocity) are free per window. Why this way round:
the SfM positions are the dependent variable and the IMU the regressor, the side
with the small error. The solve this replaced regressed IMU preintegrals on SfM
differences / dt^2 over 0.2 s intervals, which puts the SfM jitter in the
regressor and biases s towards zero by the jitter's share of the signal (-9% on a
weak 6 s session at 1 mm jitter); its std, inflated by an overlap factor, was 3x
the real scatter there. Windows of seconds also keep what slow motion says about
the scale, which 0.2 s intervals lose to the free velocities, and need no regular
keyframe spacing.

R_w(t) = A R_g(t): R_g integrates the gyro once over the recording (bias and
camera-IMU rotation from `align_imu`, refined there on absolute orientations), and
the anchor A is the chordal mean of R_wc R_ci R_g^T over the keyframes within
`anchor_span` s of the window, so the SfM rotation noise averages out. Every
integral comes from cumulative sums (exact for linearly interpolated samples): a
30 s session costs under 0.1 s. A gap in imu.json (`packer.imu_gaps`) ends a window:
no window integrates across one, each takes its anchor from keyframes of its own
gap-free stretch (the turn the phone made in the gap is unknown), and keyframes
inside a gap are left out.

Noise: e_j is the SfM jitter (white, variance v) plus k times the double-integrated
accelerometer noise (an integrated Brownian motion, covariance lambda v C(t_i, t_j)).
lambda comes from restricted maximum likelihood (floored by the accelerometer noise
measured on the samples' second differences), the windows' q0, u0 are projected
out in the whitened metric, that noise in the regressor is corrected for (it
would attenuate k), and the std of s is the
generalised least-squares one with v from the residual. Windows share no keyframe
and no IMU sample, so when their own scales scatter more than that std predicts
(chi^2/dof above 1: the SfM scale drifts along the session) the std is inflated by
the square root (Birge ratio). That one number is the uncertainty reported and
refused on, and it matches the scatter over noise draws
(tests/test_scale_calibration.py; `python -m tests.scale_sim` prints the table).

Accel sign conventions differ between platforms (CoreMotion reports minus the
specific force); a flipped sign flips k, so a negative k is read as the convention
and recorded, never as a reflection of the trajectory.

Refusals (ScaleRefused, with the reason) only where the data cannot fix the scale:
too little registered video with IMU coverage, too little motion acceleration (0.2 s
means, noise floor removed, independent of the fit), windows one scale cannot
explain (a distorted reconstruction, another recording's IMU), or std(s)/s above
`max_rel_std`. SfM distortion inside one window is not in the GLS std; the caller
passes `model_rel_std` for it (from the gyro's disagreement with the SfM rotations,
the one independent view of the model's shape a short session has), which is added
in quadrature before the check, and the refusal then says which part was too large."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from packer.imu_gaps import gap_spans, stretch_of
from packer.slam.inertial.accel import GRAVITY, detect_accel_mode, excitation
from packer.slam.inertial.imu_align import ImuTrack
from packer.slam.rotations import rotation_mean, tangent_basis
from packer.slam.scale.lsq import lstsq as _lstsq
from packer.slam.scale.lsq import lstsq_eiv as _lstsq_eiv
from packer.slam.scale.lsq import marginal_variance as _marginal_variance
from packer.slam.scale.scale_checks import explained, lever_significance, shape_spread, window_spread

_LOG_LAMBDAS = np.arange(-3.0, 6.01, 0.5)  # log10 of the IMU/SfM noise ratio searched (1/s^3)


class ScaleRefused(ValueError):
    """The data does not determine the scale; str() is the reason for the user."""


class ShapeRefused(ScaleRefused):
    """Refused for the reconstruction's shape (distorted, too noisy, or no similarity of
    the IMU's path) while the IMU saw enough motion: another model of the same images may
    pass (the stage maps it again on the gyro's rotations, `gyro_repair`)."""


class ModelDistorted(ShapeRefused):
    """Refused mostly for the model term: the reconstruction's rotations disagree with the
    gyro enough that its shape is distorted (the stage may map it again on the gyro's)."""


@dataclass
class ScaleOptions:
    accel_mode: str = "auto"  # "auto" | "removed" (userAcceleration) | "raw" (with gravity)
    accel_bias: bool = True  # also estimate a constant accelerometer bias (phones have ~0.01 g)
    window: float = 4.0  # seconds of keyframes fitted against one IMU double integral
    anchor_span: float = 5.0  # keyframes within +- this many s fix a window's IMU-to-SfM rotation
    min_duration: float = 1.0  # seconds of registered video with IMU coverage
    min_excitation: float = 0.05  # m/s^2 RMS motion acceleration (0.2 s means, noise floor removed)
    max_rel_std: float = 0.02  # refuse when std(s)/s is larger
    min_explained: float = 0.5  # refuse when one scale explains less of the windows' own fits
    lever_arm: bool = True  # also try the IMU's position in the camera frame (3 unknowns: `solve_scale`)
    lever_arm_min_chi2: float = 30.0  # ... and keep it only when it is this significant (chi^2, 3 dof)


@dataclass
class ScaleResult:
    scale: float  # metres per SfM unit
    rel_std: float  # std(s) / s (generalised least squares, noise levels from the data)
    residual: float  # RMS SfM position jitter after the fit, metres
    excitation: float  # RMS motion acceleration seen by the IMU (0.2 s means), m/s^2
    explained: float  # share of the windows' own IMU fits that the one scale reproduces
    condition: float  # condition number of the column-normalised design of the global unknowns
    confidence: float  # 0..1, from rel_std against its threshold
    accel_mode: str
    accel_sign: float  # +1, or -1 when the accelerometer reports minus the acceleration
    gravity: list[float] | None  # in the SfM frame (m/s^2), raw mode only
    accel_bias: list[float] | None  # m/s^2, IMU frame, in the accelerometer's own sign convention
    n_windows: int
    n_keyframes: int
    imu_noise_ratio: float  # lambda: IMU drift variance per s^3 over SfM jitter variance
    window_spread: float  # chi^2/dof of the windows' own scales about the common one (noise alone: ~1)
    lever_arm: list[float] | None = None  # m, the IMU's position in the camera frame, where it was kept
    lever_arm_chi2: float = 0.0  # the lever arm's significance as tried (chi^2, 3 dof; kept from lever_arm_min_chi2)
    shape_spread: float = 1.0  # chi^2/dof of a free symmetric 3x3 scale per window about the one scale (noise: ~1)
    fit_rel_std: float = 0.0  # the GLS part of rel_std (noise and window scatter)
    model_rel_std: float = 0.0  # the part for a distorted model (given by the caller)


@dataclass(frozen=True)
class _Window:
    """One window's keyframes as a regression per axis, in the eigenbasis V of its
    drift covariance C (so every lambda whitens by a diagonal scaling, no solve):
    d (n,) the eigenvalues, N (n,2) the nuisance columns [1, tau] and M (n, 3, ng+1)
    the global columns [k | k b | k g] and the positions, both rotated by V^T."""

    d: np.ndarray
    N: np.ndarray
    M: np.ndarray
    anchor: np.ndarray  # (3,3) IMU-gyro frame -> SfM world
    t0: float
    t1: float


def _windows(
    imu: ImuTrack, key_ts: np.ndarray, positions: np.ndarray, R_wc: np.ndarray, R_ci: np.ndarray, raw: bool,
    opt: ScaleOptions, lever: bool = False,
) -> list[_Window]:
    """Split the covered keyframes into windows of about `opt.window` s (>= 3
    keyframes each) and build their regressions. `lever`: three more global columns,
    -R_wc(t_j) for the unknown k r (r: the IMU's position in the camera frame): the
    camera centre is the IMU's point less R_wc r, so p_j = k x_imu(t_j) - R_wc(t_j) k r,
    exact and linear, no angular acceleration needed."""
    n_b = 3 if opt.accel_bias else 0
    n_r = 3 if lever else 0
    ng = 1 + n_b + n_r + (3 if raw else 0)
    R_g = imu.orientation(key_ts)
    anchors_k = R_wc @ R_ci @ np.swapaxes(R_g, -1, -2)
    i1, i2 = imu.integrals(key_ts)
    span = float(key_ts[-1] - key_ts[0])
    edges = np.linspace(key_ts[0], key_ts[-1], max(1, int(round(span / opt.window))) + 1)
    which = np.clip(np.searchsorted(edges, key_ts, side="right") - 1, 0, len(edges) - 2)
    groups = [np.nonzero(which == w)[0] for w in range(len(edges) - 1)]
    stretch = stretch_of(gap_spans(imu.t), key_ts)  # a window ends at a gap in the IMU, and its anchor ...
    if stretch.any():
        groups = [g[stretch[g] == s] for g in groups for s in np.unique(stretch[g])]
    out = []
    for idx in groups:
        if len(idx) < 3:
            continue
        t0, t1 = float(key_ts[idx[0]]), float(key_ts[idx[-1]])
        near = np.abs(key_ts - 0.5 * (t0 + t1)) <= max(opt.anchor_span, 0.5 * (t1 - t0))
        near &= stretch == stretch[idx[0]]  # ... comes from its own gap-free stretch (the turn across is unknown)
        A = rotation_mean(anchors_k[near])
        tau = key_ts[idx] - t0
        local = i2[idx] - i2[idx[0]] - tau[:, None] * i1[idx[0]]  # double integrals from t0
        X = np.zeros((3, len(idx), ng))
        X[:, :, 0] = (local[:, :3] @ A.T).T
        if n_b:
            X[:, :, 1:4] = -np.einsum("ab,nbc->anc", A, local[:, 3:].reshape(-1, 3, 3))
        if n_r:  # -R_wc = -A R_g R_ci^T at each keyframe
            X[:, :, 1 + n_b:1 + n_b + n_r] = -np.einsum("ab,nbc,dc->and", A, R_g[idx], R_ci)
        if raw:
            for a in range(3):
                X[a, :, 1 + n_b + n_r + a] = 0.5 * tau**2
        d, V = np.linalg.eigh(_drift_cov(tau))
        M = np.concatenate([X, positions[idx].T[:, :, None]], axis=2).transpose(1, 0, 2)
        out.append(_Window(np.clip(d, 0.0, None), V.T @ np.column_stack([np.ones(len(idx)), tau]),
                           np.einsum("ji,jab->iab", V, M), A, t0, t1))
    return out


def _drift_cov(tau: np.ndarray) -> np.ndarray:
    """Covariance of a double-integrated unit white noise (integrated Brownian
    motion) at times tau: min^2 (3 max - min) / 6."""
    lo, hi = np.minimum.outer(tau, tau), np.maximum.outer(tau, tau)
    return lo**2 * (3 * hi - lo) / 6


@dataclass
class _Reduced:
    """The stacked whitened rows with every window's q0, u0 projected out."""

    G: np.ndarray  # (rows, ng)
    y: np.ndarray
    blocks: list[slice]  # rows of each window
    logdet: float  # log|Sigma| + log|N^T Sigma^-1 N| over the windows (REML terms)
    dof: int  # rows minus the nuisance columns
    drift_trace: float  # E|k column's noise|^2 per unit accelerometer noise density^2 (s^3 -> m^2)


def _reduce(wins: list[_Window], lam: float) -> _Reduced:
    Gs, ys, blocks = [], [], []
    logdet, dof, r0, trace = 0.0, 0, 0, 0.0
    for w in wins:
        n = len(w.d)
        s = 1.0 / np.sqrt(1.0 + lam * w.d)  # Sigma^-1/2 = diag(s) V^T
        WN = w.N * s[:, None]
        v1 = np.linalg.norm(WN[:, 0])
        q1 = WN[:, 0] / v1
        u2 = WN[:, 1] - q1 * (q1 @ WN[:, 1])
        v2 = np.linalg.norm(u2)
        Q = np.column_stack([q1, u2 / v2])  # orthonormal basis of the whitened nuisance
        M = w.M * s[:, None, None]
        M = (M - np.einsum("ik,kab->iab", Q, np.einsum("ik,iab->kab", Q, M))).transpose(1, 0, 2).reshape(3 * n, -1)
        Gs.append(M[:, :-1])
        ys.append(M[:, -1])
        blocks.append(slice(r0, r0 + 3 * n))
        r0 += 3 * n
        logdet += 3 * (float(np.sum(np.log1p(lam * w.d))) + 2 * np.log(v1 * v2))
        dof += 3 * (n - 2)
        dd = w.d * s**2  # the drift, whitened: diag(d / (1 + lam d)) ...
        trace += 3 * (float(np.sum(dd)) - float(np.sum(Q**2 * dd[:, None])))  # ... and projected
    return _Reduced(np.vstack(Gs), np.concatenate(ys), blocks, logdet, dof, trace)


def _reml(wins: list[_Window]) -> tuple[float, _Reduced]:
    """The noise ratio lambda of maximal restricted likelihood (grid, then a
    parabola through the best point) and the reduced system at it."""

    def cost(loglam: float) -> tuple[float, _Reduced]:
        red = _reduce(wins, 10.0**loglam)
        GtG = red.G.T @ red.G  # normal equations: ng x ng, no factorisation of the tall G
        x = _lstsq(GtG, red.G.T @ red.y)
        rss = float(np.sum((red.G @ x - red.y) ** 2))
        dof = red.dof - red.G.shape[1]
        ev = np.linalg.eigvalsh(GtG)
        ld = float(np.sum(np.log(ev[ev > ev[-1] * 1e-24])))
        return dof * np.log(max(rss, 1e-300) / dof) + red.logdet + ld, red

    costs = [cost(v)[0] for v in _LOG_LAMBDAS]
    k = int(np.argmin(costs))
    best = float(_LOG_LAMBDAS[k])
    if 0 < k < len(costs) - 1:
        c0, c1, c2 = costs[k - 1], costs[k], costs[k + 1]
        den = c0 - 2 * c1 + c2
        if den > 0:
            best += 0.5 * (c0 - c2) / den * (_LOG_LAMBDAS[1] - _LOG_LAMBDAS[0])
    return 10.0**best, cost(best)[1]


def _measured_ratio(red: _Reduced, imu: ImuTrack) -> float:
    """k^2 q / v: lambda from the accelerometer noise q measured on the samples and
    the jitter v of a fit. A floor for REML, which on one or two windows now and
    then puts lambda near 0 and under-reports the std (a wandering bias only adds)."""
    x = _lstsq(red.G.T @ red.G, red.G.T @ red.y)
    v = float(np.sum((red.G @ x - red.y) ** 2)) / max(red.dof - red.G.shape[1], 1)
    q = imu.noise2 / 3.0 * float(np.median(np.diff(imu.t)))
    return float(x[0]) ** 2 * q / v if v > 0 else 0.0


def _gravity_fit(
    G: np.ndarray, y: np.ndarray, x: np.ndarray, col_g: int, d0: float, iters: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """Re-solve with |g| = GRAVITY, g = kg / k = GRAVITY n: for a fixed direction n
    the model is linear in (k, k b); n moves in its tangent plane (Gauss-Newton).
    Returns (x with kg = k GRAVITY n, the design of the last linearisation, whose
    first column is k's)."""
    Gg = G[:, col_g:col_g + 3]
    n = x[col_g:col_g + 3] / (np.linalg.norm(x[col_g:col_g + 3]) or 1.0)
    k = float(x[0])
    M = G
    for _ in range(iters):
        B = tangent_basis(n)
        M = np.column_stack([G[:, 0] + GRAVITY * Gg @ n, G[:, 1:col_g], k * GRAVITY * Gg @ B])
        z = _lstsq_eiv(M, y, d0)
        k = float(z[0])
        n = n + B @ z[-2:]
        n /= np.linalg.norm(n)
        x = np.concatenate([z[:col_g], k * GRAVITY * n])
    return x, M


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
    model_rel_std: float = 0.0,
) -> ScaleResult:
    """Metric scale of an SfM trajectory from the IMU (see the module docstring).

    key_ts: registered keyframe times (frame clock, increasing); positions / R_wc:
    their SfM camera centres and camera-to-world rotations; accel_g in g (IMU frame),
    gyro in rad/s; offset / R_ic / gyro_bias from `align_imu`. Raises ScaleRefused."""
    opt = options or ScaleOptions()
    key_ts = np.asarray(key_ts, dtype=np.float64)
    t = np.asarray(imu_t, dtype=np.float64) - offset  # IMU samples on the frame clock
    inside = (key_ts >= t[0]) & (key_ts <= t[-1]) & (stretch_of(gap_spans(t), key_ts) >= 0)  # none in a gap
    covered = float(np.ptp(key_ts[inside])) if inside.sum() > 1 else 0.0
    gyr = np.asarray(gyro, dtype=np.float64) - (0.0 if gyro_bias is None else np.asarray(gyro_bias))
    imu = ImuTrack(t, np.asarray(accel_g, dtype=np.float64) * GRAVITY, gyr)
    mode = detect_accel_mode(accel_g, imu) if opt.accel_mode == "auto" else opt.accel_mode
    if mode not in ("raw", "removed"):
        raise ValueError(f"accel_mode must be auto, raw or removed, got {opt.accel_mode!r}")
    raw = mode == "raw"

    def solved(lever: bool) -> ScaleResult:
        wins = []
        if inside.sum() >= 3:
            wins = _windows(imu, key_ts[inside], np.asarray(positions, dtype=np.float64)[inside],
                            np.asarray(R_wc, dtype=np.float64)[inside], np.asarray(R_ic).T, raw, opt, lever)
        spare = sum(3 * (len(w.d) - 2) for w in wins) - (wins[0].M.shape[2] - 1) if wins else 0
        if covered < opt.min_duration or spare < 3:
            raise ScaleRefused(
                f"only {covered:.2f} s of registered video ({int(inside.sum())} keyframes) with IMU coverage; "
                f"need {opt.min_duration:g} s and a few keyframes more than unknowns (longer session or more "
                "registered frames)"
            )
        lam, red = _reml(wins)
        floor = _measured_ratio(red, imu)
        if lam < floor:  # the accelerometer's own noise says the drift is at least this
            lam, red = floor, _reduce(wins, floor)
        return _fit(red, imu, wins, lam, mode, opt, 3 if lever else 0)

    result = solved(False)
    if opt.lever_arm:  # the IMU off the camera centre (a phone's: a few cm), kept where the data insist
        try:
            with_lever = solved(True)
        except ScaleRefused:  # too few keyframes for three more unknowns
            with_lever = result
        # kept where significant; otherwise the plain fit, with the significance the test found (metadata)
        result = with_lever if with_lever.lever_arm_chi2 >= opt.lever_arm_min_chi2 else replace(
            result, lever_arm_chi2=with_lever.lever_arm_chi2)
    if model_rel_std > 0 and np.isfinite(result.rel_std):
        total = float(np.hypot(result.rel_std, model_rel_std))
        result = replace(result, fit_rel_std=result.rel_std, model_rel_std=model_rel_std, rel_std=total,
                         confidence=float(np.clip(1.0 - total / opt.max_rel_std, 0.0, 1.0)))
    else:
        result = replace(result, fit_rel_std=result.rel_std)
    _check(result, opt)
    return result


def _fit(red: _Reduced, imu: ImuTrack, wins: list[_Window], lam: float, mode: str, opt: ScaleOptions,
         n_r: int = 0) -> ScaleResult:
    """Least squares on the reduced system, the sign convention, |g| refinement, and
    the statistics the refusal checks read (rel_std, explained, excitation); `n_r`:
    the lever arm's columns follow the bias's (`_windows`)."""
    G, y = red.G.copy(), red.y
    n_b = 3 if opt.accel_bias else 0
    col_g = 1 + n_b + n_r
    d0 = imu.noise2 / 3.0 * float(np.median(np.diff(imu.t))) * red.drift_trace  # noise energy in k's column
    x = _lstsq_eiv(G, y, d0)
    sign = 1.0
    if x[0] < 0:  # the accelerometer reports minus the acceleration
        sign = -1.0
        G[:, :1 + n_b] *= -1.0
        x[:1 + n_b] *= -1.0
    M, n_free = G, G.shape[1]
    if mode == "raw":
        x, M = _gravity_fit(G, y, x, col_g, d0)
        n_free -= 1
    res = y - G @ x
    k = float(x[0])
    sigma2 = float(res @ res) / max(red.dof - n_free, 1)
    b = x[1:1 + n_b] / k if n_b and k > 0 else np.zeros(3)
    g = x[col_g:] / k if mode == "raw" and k > 0 else np.zeros(3)
    spread = window_spread(G, y, x, red.blocks, n_b + n_r, g, sigma2)
    shape = shape_spread(G, y, red.blocks, red.dof)
    inflate = max(spread, shape, 1.0)
    var_k = _marginal_variance(M, 0) * sigma2 * inflate
    lever, lever_chi2 = lever_significance(M, x, 1 + n_b, n_r, sigma2 * inflate)
    rel_std = float(np.sqrt(var_k) / k) if k > 0 else float("inf")
    colnorm = np.linalg.norm(M, axis=0)
    colnorm[colnorm == 0] = 1.0
    sv = np.linalg.svd(M / colnorm, compute_uv=False)
    return ScaleResult(
        scale=1.0 / k if k > 0 else float("nan"),
        rel_std=rel_std,
        residual=float(np.sqrt(sigma2)) / k if k > 0 else float("inf"),
        excitation=excitation(imu, wins, n_b > 0, mode == "raw"),
        explained=explained(G, red.y, res, red.blocks),
        condition=float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf"),
        confidence=float(np.clip(1.0 - rel_std / opt.max_rel_std, 0.0, 1.0)) if np.isfinite(rel_std) else 0.0,
        accel_mode=mode,
        accel_sign=sign,
        gravity=[float(v) for v in g] if mode == "raw" else None,
        accel_bias=[float(v) for v in b] if n_b else None,
        n_windows=len(wins),
        n_keyframes=int(sum(len(w.d) for w in wins)),
        imu_noise_ratio=lam,
        window_spread=spread,
        lever_arm=lever,
        lever_arm_chi2=lever_chi2,
        shape_spread=shape,
    )


def still_reason(excitation: float, need: float) -> str:
    """The one refusal for a camera that barely moves through space, in every solver's words."""
    return (f"scale not observable: the IMU sees only {excitation:.3f} m/s^2 RMS motion acceleration "
            f"(need >= {need:g}); the camera barely translates. Move the gripper through "
            "space while recording, or use --scale marker / known-distance")


def _check(r: ScaleResult, opt: ScaleOptions) -> None:
    """Refuse with the first reason that applies (most basic first)."""
    if r.excitation < opt.min_excitation:
        raise ScaleRefused(still_reason(r.excitation, opt.min_excitation))
    if not (r.scale > 0) or r.explained < opt.min_explained:
        raise ScaleRefused(
            f"scale not observable: one scale explains only {max(r.explained, 0.0):.0%} of what the IMU "
            f"explains of the SfM motion window by window (need {opt.min_explained:.0%}): the reconstruction "
            "is distorted (try the default --mapper global or a smaller --keyframe-step) or imu.json belongs "
            "to another recording"
        )
    if r.rel_std > opt.max_rel_std and r.model_rel_std > r.fit_rel_std:
        raise ModelDistorted(
            f"scale uncertain: {r.scale:.4g} +- {r.rel_std:.1%} (need <= {opt.max_rel_std:.0%}), mostly because the "
            f"reconstruction disagrees with the gyro (+-{r.model_rel_std:.1%} of it): its shape is distorted, which "
            "no scale fixes. Plain surfaces, blur or the glove filling the view leave too few good features: record "
            "with more texture and light in view"
        )
    if (r.rel_std > opt.max_rel_std and r.shape_spread > max(r.window_spread, 1.0)
            and r.fit_rel_std / np.sqrt(r.shape_spread) <= opt.max_rel_std):
        raise ShapeRefused(
            f"scale uncertain: {r.scale:.4g} +- {r.rel_std:.1%} (need <= {opt.max_rel_std:.0%}), mostly because the "
            f"reconstruction's path is no similarity of the IMU's (a scale per direction fits the accelerometer "
            f"{r.shape_spread:.1f}x better than its noise explains): stretched along the view or its scale changes "
            "within the session. Record with more of the scene near the camera (within ~1 m) and more hand travel"
        )
    if r.rel_std > opt.max_rel_std and r.excitation >= 5 * opt.min_excitation:
        raise ShapeRefused(
            f"scale poorly constrained: {r.scale:.4g} +- {r.rel_std:.1%} (need <= {opt.max_rel_std:.0%}) although the "
            f"IMU sees enough motion ({r.excitation:.2f} m/s^2 RMS): the reconstruction's positions are too noisy "
            "(few or weak features: record with more texture in view, or a longer session)"
        )
    if r.rel_std > opt.max_rel_std:
        raise ScaleRefused(
            f"scale poorly constrained: {r.scale:.4g} +- {r.rel_std:.1%} (need <= {opt.max_rel_std:.0%}); "
            "record with more translation or use --scale marker / known-distance"
        )
