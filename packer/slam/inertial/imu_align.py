"""Camera-to-IMU rotation and IMU clock offset from gyro vs visual rotation.

The gyro measures the body angular velocity in the IMU frame; SfM gives the
camera-frame rotation between keyframes. Over a keyframe interval [a, b] (frame
clock) the integrated gyro over [a + offset, b + offset] (IMU clock) equals
R_ic @ Log(R_a^T R_b) + gyro_bias * (b - a). Comparing integrals, not rates, keeps
the gyro and the visual side filtered identically, so the offset is unbiased.

1. coarse offset: normalised cross-correlation of the rotation-rate *norms*
   (independent of the unknown axis convention) over every offset that keeps the
   video inside the IMU recording;
2. rotation: orthogonal Procrustes (Kabsch) of visual vs gyro increments, with a
   constant gyro bias re-estimated in turn;
3. fine offset: 1-D search of the vector residual around the coarse peak, with the
   rotation re-fitted at each candidate, and a parabola through the minimum;
4. bias and rotation refined on absolute orientations (`refine_by_orientation`):
   every keyframe's SfM rotation against the gyro integrated from the start, not
   just against its neighbour, which makes the bias 3-4x more precise (the scale
   solve integrates the gyro over seconds; with gravity in the accelerometer a
   1e-3 rad tilt is 1 cm/s^2 of false acceleration).

`ImuTrack` is the IMU integrated once (gyro orientation, cumulative integrals of
the rotated accelerometer), shared by step 4 and the scale solve.

No axis convention is assumed anywhere: R_ic comes out of the data.

A gap in imu.json (`packer.imu_gaps`: the app's main thread busy, no sample for
0.1-0.5 s) is integrated over by nothing here: the cumulative integrals add nothing
across one (the gyro's orientation holds still there), an interval that reaches
into one is left out of every comparison, and absolute orientations are compared
within each gap-free stretch, each with its own constant (the turn the phone made
in the gap is unknown). Without a gap every number is what it was."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from packer.imu_gaps import crosses_gap, gap_spans, gap_steps, second_differences, stretch_of
from packer.slam.rotations import cumulative_rotations, procrustes_rotation, rotation_mean, slerp, so3_exp, so3_log


class AlignmentError(ValueError):
    """Gyro and video cannot be aligned; the message says why (caller adds the session)."""


@dataclass
class ImuAlignment:
    offset: float  # seconds; IMU clock = frame clock + offset
    R_ic: np.ndarray  # (3,3) rotates camera-frame vectors into the IMU frame
    gyro_bias: np.ndarray  # (3,) rad/s in the IMU frame
    residual: float  # RMS rad/s of the gyro-vs-visual increment mismatch
    correlation: float  # normalised correlation of rate norms at the chosen offset
    n_intervals: int
    rotation_rms: float  # RMS visual rotation rate, rad/s (the excitation)


class GyroIntegral:
    """Cumulative trapezoid integral of the gyro vector, so the increment over any
    interval is two interpolations (cheap enough to scan thousands of offsets)."""

    def __init__(self, t: np.ndarray, gyro: np.ndarray):
        self.t = np.asarray(t, dtype=np.float64)
        g = np.asarray(gyro, dtype=np.float64)
        steps = 0.5 * (g[1:] + g[:-1]) * np.diff(self.t)[:, None]
        steps[gap_steps(self.t)] = 0.0  # nothing across a gap (the intervals that reach into one are left out)
        self.cum = np.vstack([np.zeros((1, 3)), np.cumsum(steps, axis=0)])

    def at(self, t: np.ndarray) -> np.ndarray:
        return np.stack([np.interp(t, self.t, self.cum[:, i]) for i in range(3)], axis=-1)

    def increment(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(M,3) integral of the gyro over [a_i, b_i] (IMU clock)."""
        return self.at(b) - self.at(a)


class ImuTrack:
    """The IMU on the frame clock, integrated once: the gyro orientation R_g(t)
    (relative to the first sample), f = [R_g a, R_g] (12 channels) and its first and
    second cumulative integrals, exact for f linear between samples; noise2 is the
    accelerometer's white-noise variance per sample (3 axes), from second differences."""

    def __init__(self, t: np.ndarray, acc: np.ndarray, gyr: np.ndarray):
        self.t = np.asarray(t, dtype=np.float64)
        h = np.where(gap_steps(self.t), 0.0, np.diff(self.t))  # nothing is integrated across a gap
        Q = _integrated(self.t, gyr)
        self.Q = Q
        d2 = second_differences(self.t, acc)
        self.noise2 = float(np.mean(np.sum(d2**2, axis=1))) / 6.0 if len(d2) else 0.0
        f = np.concatenate([np.einsum("nij,nj->ni", Q, acc), Q.reshape(-1, 9)], axis=1)
        self.f = f
        hh = h[:, None]
        self.c1 = np.vstack([np.zeros((1, 12)), np.cumsum(hh * (f[:-1] + f[1:]) / 2, axis=0)])
        step2 = hh * self.c1[:-1] + hh**2 * (2 * f[:-1] + f[1:]) / 6
        self.c2 = np.vstack([np.zeros((1, 12)), np.cumsum(step2, axis=0)])

    def _seg(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = np.clip(np.searchsorted(self.t, ts, side="right") - 1, 0, len(self.t) - 2)
        h = (self.t[k + 1] - self.t[k])[:, None]
        return k, (ts - self.t[k])[:, None], (self.f[k + 1] - self.f[k]) / h

    def integrals(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first, second) integrals of f from the first sample to each of ts, (M,12)."""
        k, u, m = self._seg(np.asarray(ts, dtype=np.float64))
        f = self.f[k]
        i1 = self.c1[k] + f * u + m * u**2 / 2
        i2 = self.c2[k] + self.c1[k] * u + f * u**2 / 2 + m * u**3 / 6
        return i1, i2

    def orientation(self, ts: np.ndarray) -> np.ndarray:
        return _orientation_at(self.t, self.Q, ts)


def _integrated(t: np.ndarray, gyr: np.ndarray) -> np.ndarray:
    """(N,3,3) the gyro's orientation at each sample relative to the first (midpoint rule)."""
    Q = np.empty((len(t), 3, 3))
    Q[0] = np.eye(3)
    steps = 0.5 * (gyr[1:] + gyr[:-1]) * np.diff(t)[:, None]
    steps[gap_steps(t)] = 0.0  # across a gap: no turn (unknown; each stretch is compared on its own)
    Q[1:] = cumulative_rotations(so3_exp(steps))
    return Q


def _orientation_at(t: np.ndarray, Q: np.ndarray, ts: np.ndarray) -> np.ndarray:
    ts = np.asarray(ts, dtype=np.float64)
    k = np.clip(np.searchsorted(t, ts, side="right") - 1, 0, len(t) - 2)
    return slerp(Q[k], Q[k + 1], (ts - t[k]) / (t[k + 1] - t[k]))


def gyro_orientation(t: np.ndarray, gyr: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """(M,3,3) the gyro's orientation at times `ts` (its clock), relative to its first sample:
    `ImuTrack.orientation` without the accelerometer's integrals, which the gyro's users
    (`gyro_prior`, `gyro_ba`: many calls per adjustment) do not need."""
    t = np.asarray(t, dtype=np.float64)
    return _orientation_at(t, _integrated(t, np.asarray(gyr, dtype=np.float64)), ts)


def visual_increments(
    key_ts: np.ndarray, R_wc: np.ndarray, max_gap: float = 0.5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Consecutive registered keyframes -> (a, b, phi) with phi = Log(R_a^T R_b), the
    camera-frame rotation over [a, b]. Intervals longer than `max_gap` (an
    unregistered stretch) are dropped: their rotation may wrap or be ambiguous."""
    key_ts = np.asarray(key_ts, dtype=np.float64)
    R_wc = np.asarray(R_wc, dtype=np.float64)
    a, b = key_ts[:-1], key_ts[1:]
    phi = so3_log(np.swapaxes(R_wc[:-1], -1, -2) @ R_wc[1:])
    keep = (b - a) <= max_gap
    return a[keep], b[keep], phi[keep]


def _ncc(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    y = y - y.mean()
    d = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / d) if d > 0 else 0.0


def _fit_rotation_bias(
    phi_cam: np.ndarray, phi_imu: np.ndarray, dt: np.ndarray, iters: int = 3, with_bias: bool = True
) -> tuple[np.ndarray, np.ndarray, float]:
    """R, bias minimising sum |R phi_cam + bias dt - phi_imu|^2 (alternating; both
    subproblems are closed-form). Returns (R, bias, RMS residual in rad/s)."""
    bias = np.zeros(3)
    R = np.eye(3)
    for _ in range(iters if with_bias else 1):
        R = procrustes_rotation(phi_cam, phi_imu - bias * dt[:, None])
        if with_bias:
            r = phi_imu - phi_cam @ R.T
            bias = (r * dt[:, None]).sum(0) / (dt**2).sum()
    res = phi_cam @ R.T + bias * dt[:, None] - phi_imu
    rms = float(np.sqrt(np.mean(np.sum((res / dt[:, None]) ** 2, axis=1))))
    return R, bias, rms


class _OffsetSearch:
    """The visual increments and the gyro integral of one alignment, with the two
    costs both search steps evaluate at a candidate clock offset d (IMU clock =
    frame clock + d): only intervals whose shifted span lies inside the IMU
    recording, and reaches into none of its gaps, count."""

    def __init__(
        self, a: np.ndarray, b: np.ndarray, phi: np.ndarray, rate_v: np.ndarray, gi: GyroIntegral, min_intervals: int
    ):
        self.a, self.b, self.phi, self.gi = a, b, phi, gi
        self.dt = b - a
        self.rate_v = rate_v  # visual rotation rate per interval, rad/s
        self.t_lo, self.t_hi = float(gi.t[0]), float(gi.t[-1])
        self.min_intervals = min_intervals
        self.gaps = gap_spans(gi.t)

    def inside(self, d: float) -> np.ndarray:
        inside = (self.a + d >= self.t_lo) & (self.b + d <= self.t_hi)
        return inside & ~crosses_gap(self.gaps, self.a + d, self.b + d) if len(self.gaps) else inside

    def score(self, d: float) -> tuple[float, int]:
        """(normalised correlation of the rate norms, intervals used); -inf when too
        few intervals fall inside the IMU recording at this offset."""
        inside = self.inside(d)
        if inside.sum() < max(self.min_intervals, 0.5 * len(self.a)):
            return -np.inf, 0
        rate_g = np.linalg.norm(self.gi.increment(self.a[inside] + d, self.b[inside] + d), axis=1) / self.dt[inside]
        return _ncc(self.rate_v[inside], rate_g), int(inside.sum())

    def scores(self, offsets: np.ndarray) -> np.ndarray:
        """`score(d)[0]` for every candidate offset at once (the coarse search scans
        thousands: one interpolation over a block of them instead of one per offset;
        blocks of ~200k intervals keep a long session's memory small)."""
        offsets = np.asarray(offsets, dtype=np.float64)
        block = max(1, 200_000 // max(len(self.a), 1))
        if len(offsets) > block:
            return np.concatenate([self.scores(offsets[i:i + block]) for i in range(0, len(offsets), block)])
        d = offsets[:, None]
        a, b = self.a[None, :] + d, self.b[None, :] + d
        inside = (a >= self.t_lo) & (b <= self.t_hi)
        if len(self.gaps):
            inside &= ~crosses_gap(self.gaps, a, b)
        enough = inside.sum(axis=1) >= max(self.min_intervals, 0.5 * len(self.a))
        rate_g = np.linalg.norm(self.gi.increment(a.ravel(), b.ravel()), axis=1).reshape(a.shape) / self.dt
        w = inside.astype(np.float64)
        n = np.maximum(w.sum(axis=1, keepdims=True), 1.0)
        x = self.rate_v[None, :] - (w * self.rate_v).sum(axis=1, keepdims=True) / n
        y = rate_g - (w * rate_g).sum(axis=1, keepdims=True) / n
        num = (w * x * y).sum(axis=1)
        den = np.sqrt((w * x * x).sum(axis=1) * (w * y * y).sum(axis=1))
        ncc = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        return np.where(enough, ncc, -np.inf)

    def vec_cost(self, d: float, estimate_bias: bool) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """(RMS vector residual, R_ic, gyro bias, intervals used) with the rotation
        (and bias) re-fitted at this offset."""
        inside = self.inside(d)
        phi_imu = self.gi.increment(self.a[inside] + d, self.b[inside] + d)
        R, bias, rms = _fit_rotation_bias(self.phi[inside], phi_imu, self.dt[inside], with_bias=estimate_bias)
        return rms, R, bias, inside


def _coarse_offset(search: _OffsetSearch, lo: float, hi: float) -> float:
    """Step 1: norm correlation on a grid over [lo, hi] (step <= 20 ms keeps the
    ~100 ms wide peak of hand motion sampled), then a 1 ms grid around the best."""
    step = float(np.clip((hi - lo) / 4000.0, 0.002, 0.02))
    grid = np.arange(lo, hi + step, step)
    scores = search.scores(grid)
    if not np.isfinite(scores).any():
        raise AlignmentError("no clock offset puts the video inside the IMU recording")
    d0 = float(grid[int(np.nanargmax(scores))])
    fine = np.arange(d0 - 2 * step, d0 + 2 * step + 1e-4, 0.001)
    fs = search.scores(fine)
    return float(fine[int(np.argmax(fs))])


def _fine_offset(search: _OffsetSearch, d0: float, estimate_bias: bool) -> float:
    """Steps 2 + 3: vector residual with the rotation (and bias) re-fitted per
    candidate within +-12 ms of the coarse offset, 0.5 ms apart, refined by a
    parabola through the minimum and its neighbours."""
    cand = np.arange(d0 - 0.012, d0 + 0.012 + 1e-9, 0.0005)
    costs = np.array([search.vec_cost(d, estimate_bias)[0] for d in cand])
    k = int(np.argmin(costs))
    best = float(cand[k])
    if 0 < k < len(cand) - 1:  # parabola through the minimum and its neighbours
        c0, c1, c2 = costs[k - 1], costs[k], costs[k + 1]
        den = c0 - 2 * c1 + c2
        if den > 0:
            best += 0.5 * (c0 - c2) / den * (cand[1] - cand[0])
    return best


def align_imu(
    key_ts: np.ndarray,
    R_wc: np.ndarray,
    imu_t: np.ndarray,
    gyro: np.ndarray,
    *,
    max_gap: float = 0.5,
    min_rotation_rms: float = 0.02,
    min_intervals: int = 8,
    max_offset: float | None = None,
    estimate_bias: bool = True,
) -> ImuAlignment:
    """Estimate the IMU clock offset and the camera-to-IMU rotation.

    key_ts: registered keyframe times (frame clock, increasing); R_wc: their
    camera-to-world rotations; imu_t / gyro: the IMU clock and rad/s samples.
    `max_offset` bounds |offset - (imu_t[0] - key_ts[0])| when given; by default
    every offset that keeps 90% of the video inside the IMU recording is searched."""
    a, b, phi = visual_increments(key_ts, R_wc, max_gap)
    if len(a) < min_intervals:
        raise AlignmentError(f"only {len(a)} usable keyframe intervals for gyro alignment; need {min_intervals}")
    rate_v = np.linalg.norm(phi, axis=1) / (b - a)
    rot_rms = float(np.sqrt(np.mean(rate_v**2)))
    if rot_rms < min_rotation_rms:
        raise AlignmentError(
            f"the camera barely rotates ({rot_rms:.3f} rad/s RMS, need {min_rotation_rms}): "
            "gyro/video clock offset and camera-IMU rotation are not observable"
        )
    search = _OffsetSearch(a, b, phi, rate_v, GyroIntegral(imu_t, gyro), min_intervals)
    t_lo, t_hi = search.t_lo, search.t_hi
    dur = float(b[-1] - a[0])
    slack = 0.1 * dur
    lo = t_lo - a[0] - slack
    hi = t_hi - b[-1] + slack
    if max_offset is not None:
        c = t_lo - float(key_ts[0])
        lo, hi = max(lo, c - max_offset), min(hi, c + max_offset)
    if hi < lo:
        raise AlignmentError(
            f"the IMU recording ({t_hi - t_lo:.2f} s) cannot cover the video's registered span ({dur:.2f} s)"
        )
    best = _fine_offset(search, _coarse_offset(search, lo, hi), estimate_bias)
    rms, R, bias, inside = search.vec_cost(best, estimate_bias)
    corr, n = search.score(best)
    sv = np.linalg.svd(phi[inside], compute_uv=False)
    if sv[1] < 0.05 * sv[0]:
        raise AlignmentError(
            "the camera rotates about a single axis only: the camera-IMU rotation is not observable"
        )
    al = ImuAlignment(best, R, bias, rms, corr, n, rot_rms)
    return refine_by_orientation(key_ts, R_wc, imu_t, gyro, al, estimate_bias=estimate_bias)


def worst_stretch(key_ts: np.ndarray, R_wc: np.ndarray, imu_t: np.ndarray, gyro: np.ndarray, al: ImuAlignment,
                  seconds: float = 1.0) -> tuple[float, float, float]:
    """(start, end, share): the `seconds` of video (frame clock) where the visual
    rotations disagree with the aligned gyro most, and that stretch's share of the
    whole squared disagreement. A refusal names it, so the user can look at what was
    in view there (a plain table, the glove filling the frame, a blur)."""
    a, b, phi = visual_increments(key_ts, R_wc)
    inc = GyroIntegral(imu_t, gyro).increment(a + al.offset, b + al.offset)
    r2 = np.sum((phi @ al.R_ic.T + np.outer(b - a, al.gyro_bias) - inc) ** 2, axis=1)
    inside = (a + al.offset >= imu_t[0]) & (b + al.offset <= imu_t[-1])
    inside &= ~crosses_gap(gap_spans(imu_t), a + al.offset, b + al.offset)
    r2 = np.where(inside, r2, 0.0)
    if len(a) == 0 or r2.sum() <= 0:
        return float(key_ts[0]), float(key_ts[-1]), 0.0
    c = np.concatenate([[0.0], np.cumsum(r2)])
    ends = np.searchsorted(b, a + seconds, side="right")  # intervals [i, ends[i]) lie within `seconds` of a[i]
    i = int(np.argmax(c[ends] - c[np.arange(len(a))]))
    j = max(int(ends[i]) - 1, i)
    return float(a[i]), float(b[j]), float((c[j + 1] - c[i]) / c[-1])


def refine_by_orientation(
    key_ts: np.ndarray, R_wc: np.ndarray, imu_t: np.ndarray, gyro: np.ndarray, al: ImuAlignment,
    estimate_bias: bool = True, iters: int = 2, prior_rot: float = 0.02, prior_bias: float = 0.002,
) -> ImuAlignment:
    """Step 4: gyro bias and camera-IMU rotation refined on absolute orientations.

    R_wc R_ci R_g(t)^T, with R_g the bias-corrected gyro integrated from the first
    sample, must be one constant rotation; to first order its log at keyframe j is
    a - K(t_j) beta + R_g(t_j) delta, K = the integral of R_g, for a bias correction
    beta and a rotation correction R_ic <- Exp(delta) R_ic. One linear least squares
    over every keyframe (a weak prior, `prior_rot` rad and `prior_bias` rad/s, keeps
    a direction the motion leaves unobservable where steps 1-3 put it). Increments
    over single keyframe intervals leave the bias ~5e-4 rad/s off, which over a few
    seconds tilts the gyro frame by milliradians: cm/s^2 of false acceleration once
    the accelerometer carries gravity.

    Across a gap in the IMU the gyro's turn is unknown: each gap-free stretch has its
    own constant (a), and a keyframe inside a gap is left out."""
    t = np.asarray(imu_t, dtype=np.float64) - al.offset
    key_ts = np.asarray(key_ts, dtype=np.float64)
    stretch = stretch_of(gap_spans(t), key_ts)
    inside = (key_ts >= t[0]) & (key_ts <= t[-1]) & (stretch >= 0)
    if inside.sum() < 3:
        return al
    kt, Rw, stretch = key_ts[inside], np.asarray(R_wc, dtype=np.float64)[inside], stretch[inside]
    bias, R_ic = np.asarray(al.gyro_bias, dtype=np.float64), al.R_ic
    n = len(kt)
    constants = _stretch_columns(stretch)
    m = constants.shape[1]  # 3 per stretch
    for _ in range(iters):
        track = ImuTrack(t, np.zeros((len(t), 3)), np.asarray(gyro, dtype=np.float64) - bias)
        Rg = track.orientation(kt)
        anchors = Rw @ R_ic.T @ np.swapaxes(Rg, -1, -2)
        r = _anchor_residuals(anchors, stretch).reshape(-1)
        cols = [constants, Rg.reshape(3 * n, 3)]
        if estimate_bias:
            cols.append(-track.integrals(kt)[0][:, 3:].reshape(3 * n, 3))
        D = np.hstack(cols)
        res = r - D @ np.linalg.lstsq(D, r, rcond=None)[0]
        sigma = float(np.sqrt(res @ res / max(3 * n - D.shape[1], 1)))
        prior = np.zeros((D.shape[1] - m, D.shape[1]))
        scales = [prior_rot] * 3 + ([prior_bias] * 3 if estimate_bias else [])
        prior[:, m:] = np.diag([max(sigma, 1e-9) / p for p in scales])
        z = np.linalg.lstsq(np.vstack([D, prior]), np.concatenate([r, np.zeros(len(prior))]), rcond=None)[0]
        R_ic = so3_exp(z[m:m + 3]) @ R_ic
        if estimate_bias:
            bias = bias + z[m + 3:m + 6]
    return replace(al, R_ic=R_ic, gyro_bias=bias)


def _stretch_columns(stretch: np.ndarray) -> np.ndarray:
    """(3n, 3S) the constant per gap-free stretch of n keyframes (S stretches among them):
    np.tile(np.eye(3), (n, 1)) for one."""
    labels = np.unique(stretch)
    if len(labels) == 1:
        return np.tile(np.eye(3), (len(stretch), 1))
    out = np.zeros((len(stretch), 3, 3 * len(labels)))
    for j, label in enumerate(labels):
        out[stretch == label, :, 3 * j:3 * j + 3] = np.eye(3)
    return out.reshape(3 * len(stretch), -1)


def _anchor_residuals(anchors: np.ndarray, stretch: np.ndarray) -> np.ndarray:
    """(n,3) each anchor's log from its gap-free stretch's mean anchor."""
    labels = np.unique(stretch)
    if len(labels) == 1:
        return so3_log(np.swapaxes(rotation_mean(anchors), -1, -2) @ anchors)
    out = np.zeros((len(anchors), 3))
    for label in labels:
        sel = stretch == label
        out[sel] = so3_log(np.swapaxes(rotation_mean(anchors[sel]), -1, -2) @ anchors[sel])
    return out
