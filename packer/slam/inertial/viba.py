"""Metric scale by a visual-inertial bundle adjustment (VI-BA) over the keyframes, with GTSAM.

Why: the windowed accelerometer solve (`packer.slam.scale.scale`) takes the SfM trajectory
as given and fits one scale to it. When the reconstruction is distorted (plain
surfaces, sliding tracks: its parts at scales a few % apart, rotations that disagree
with the gyro) no single scale fits, and that solve can only refuse. Here the
IMU and the image observations constrain the same poses jointly (Forster et al.,
"On-Manifold Preintegration"; the formulation of VINS-Mono, ORB-SLAM3, OKVIS), so
the gyro straightens the rotations, the accelerometer ties the translation scale
along the whole path, and the landmarks re-triangulate in metres.

Variables per registered keyframe k: the IMU pose X_k (world_T_imu, metres; the
world is the SfM frame, scaled), its velocity V_k and IMU bias B_k; per 3-D point a
landmark L_j. Factors:

- CombinedImuFactor between consecutive keyframes: the IMU samples between them
  (frame clock = IMU clock - offset from `align_imu`) preintegrated on the bias
  estimate, with a bias random walk (none across a gap in imu.json, `packer.imu_gaps`:
  the bias crosses it by its random walk, a keyframe no IMU factor reaches gets a weak
  velocity prior). The app's accelerometer is gravity-removed (userAcceleration, g
  units): zero gravity in the preintegration; a raw one, the windowed solve's (SfM frame).
- projection factors (Cal3DS2 = COLMAP's SIMPLE_RADIAL f, cx, cy, k1 after its bundle
  adjustment) from every observation of a point seen in >= 3 keyframes, robust
  (Huber), through the fixed camera-IMU extrinsic body_P_sensor = (R_ic, 0);
- a tight prior on the first pose (the gauge: without gravity nothing else fixes
  the world's orientation and origin) and weak priors on the first velocity and bias.

Two Levenberg-Marquardt passes: the second without observations the first left
more than `outlier_px` off (a slid track, the glove's corners).

Scale: the metres per SfM unit of the sim(3) fit of the refined centres to the SfM
centres. Its std: to first order s = w^T x, w the fit's derivative with respect to
every keyframe position (sum_k (c_k - c_mean) . dp_k / sum |c_k - c_mean|^2); the
joint marginal covariance of the keyframe positions from gtsam.Marginals gives
var(s) = w^T Sigma w, inflated by the Birge ratio (chi^2/dof of the whole graph when
above 1: the noise models are then too optimistic).

Checks that see a bad model (returned, the caller decides): the IMU factors'
chi^2 per degree of freedom (the preintegrated motion against the refined poses:
~1 for a consistent model), the reprojection RMS and share of inliers."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from packer.imu_gaps import crosses_gap, gap_spans, stretch_of
from packer.slam.inertial.accel import GRAVITY, at_camera_centre
from packer.slam.inertial.viba_inputs import imu_noise_densities, rolling_shutter_correct, select_tracks
from packer.slam.inertial.viba_timing import best_lever, best_timing, estimate_readout
from packer.slam.rotations import umeyama


class VibaError(ValueError):
    """The bundle adjustment could not run or did not converge; str() says why."""


@dataclass
class VibaOptions:
    pixel_sigma: float = 1.0  # px, the observations' noise (before the Huber kernel)
    huber_k: float = 1.345  # in sigmas: beyond it an observation's weight falls off
    outlier_px: float = 4.0  # observations further off after the first pass are dropped
    min_track: int = 3  # a point must be seen by this many keyframes (2-view points are weakly placed)
    max_points: int = 1500  # longest tracks first (3000: 2-3x the time, the same scale within 0.01%)
    noise_factor: float = 2.0  # IMU white noise measured from the samples, times this (unmodelled effects)
    accel_bias_rw: float = 1e-3  # m/s^2/sqrt(s), accelerometer bias random walk
    gyro_bias_rw: float = 1e-4  # rad/s/sqrt(s)
    max_iterations: int = 15
    max_imu_chi2: float = 2.0  # refuse above: the IMU factors' chi^2/dof (consistent models: 0.02-1.2, a broken
    # one: thousands; a 1-2 deg error in the camera-IMU rotation alone gives ~1)
    max_gyro_disagreement: float = 0.5  # refuse before solving above: the SfM rotations' gyro residual over the
    # rotation rate (0.1-0.23 on distorted models the solve repaired; ~1 on a model that is wrong, not distorted)
    min_inliers: float = 0.8  # refuse when fewer observations survive the outlier pass
    model_factor: float = 0.08  # the std gets this times the SfM's gyro disagreement above gyro_noise_floor (in
    # quadrature): what a distorted input model leaves in the scale after the bundle adjustment
    rolling_shutter: float | None = None  # s, the sensor's readout (row v at (v/H - 1/2) of it after the frame
    # time); 0: a global shutter; None: estimated (`viba_timing.estimate_readout`)
    refine_camera: bool = True  # focal length and k1 solved with the poses (Cal3Bundler = SIMPLE_RADIAL)
    gyro_bias_prior: float = 0.01  # rad/s, the std of the prior on the first keyframe's gyro bias around its start
    offset_search: float = 0.0  # s: search the clock offset this far around the one given, with the readout
    # (`viba_timing`: a repaired model's offset is its start's); 0: hold the offset given
    lever_search: float = 0.04  # m: where a lever arm is given, search it this far around (`viba_timing.best_lever`);
    # 0: hold it
    landmark_prior: float = 10.0  # m, a prior on every point where it starts: keeps a point seen along one ray
    # (no parallax, a corner on the glove) from making the system singular; ~1e-7 of what one observation weighs


@dataclass
class VibaResult:
    T_wc: np.ndarray  # (M,4,4) refined camera-to-world, metres, SfM-aligned world (M = keyframes given)
    scale: float  # metres per SfM unit (sim(3) fit of the refined centres to the SfM centres)
    rel_std: float  # std(scale)/scale from the marginal covariance (Birge-inflated)
    imu_chi2: float  # IMU factors' chi^2 per dof after the solve (~1 for a consistent model)
    visual_chi2: float  # projection factors' chi^2 per dof (robust-weighted)
    reprojection_rms: float  # px, inliers
    inlier_fraction: float  # observations kept in the second pass
    n_points: int
    n_observations: int
    accel_bias: np.ndarray  # (3,) m/s^2, the accelerometer's own sign (as the windowed solve's), first keyframe
    gyro_bias: np.ndarray  # (3,) rad/s
    seconds: float
    camera: list[float]  # [f, cx, cy, k1] after the solve
    rolling_shutter: float = 0.0  # s, the readout used (given or estimated)
    offset_shift: float = 0.0  # s, added to the clock offset given (`VibaOptions.offset_search`)
    lever_arm: np.ndarray | None = None  # m, the IMU's position in the camera frame used (searched: `lever_search`)


def _params(gsam, acc_d: float, gyr_d: float, gravity: np.ndarray, R_ic: np.ndarray, opt: VibaOptions):
    """PreintegrationCombinedParams with the measured noise, the world's gravity
    (zero for a gravity-removed accelerometer) and the IMU's pose in the camera
    frame (rotation R_ci, no lever arm): the pose variables are the cameras', so the
    projection factors can share a calibration variable."""
    p = gsam.PreintegrationCombinedParams(np.asarray(gravity, dtype=np.float64))
    p.setBodyPSensor(gsam.Pose3(gsam.Rot3(np.asarray(R_ic).T), np.zeros(3)))
    f = opt.noise_factor
    p.setAccelerometerCovariance(np.eye(3) * (f * acc_d) ** 2)
    p.setGyroscopeCovariance(np.eye(3) * (f * gyr_d) ** 2)
    p.setIntegrationCovariance(np.eye(3) * 1e-8)
    p.setBiasAccCovariance(np.eye(3) * opt.accel_bias_rw**2)
    p.setBiasOmegaCovariance(np.eye(3) * opt.gyro_bias_rw**2)
    return p


def _preintegrate(gsam, params, bias, t: np.ndarray, acc: np.ndarray, gyr: np.ndarray, ta: float, tb: float):
    """Samples over [ta, tb] (frame clock), the interval split at every sample and each
    piece integrated with the measurement linearly interpolated at its midpoint."""
    inner = t[(t > ta) & (t < tb)]
    edges = np.concatenate([[ta], inner, [tb]])
    mid = 0.5 * (edges[1:] + edges[:-1])
    a = np.stack([np.interp(mid, t, acc[:, i]) for i in range(3)], axis=1)
    w = np.stack([np.interp(mid, t, gyr[:, i]) for i in range(3)], axis=1)
    pim = gsam.PreintegratedCombinedMeasurements(params, bias)
    for ai, wi, dt in zip(a, w, np.diff(edges)):
        if dt > 1e-9:
            pim.integrateMeasurement(ai, wi, float(dt))
    return pim


@dataclass
class _Problem:
    """What the graph is built from, all in the frame clock and the SfM world."""

    key_ts: np.ndarray  # (M,) keyframes inside the IMU span
    R_wc: np.ndarray  # (M,3,3) initial camera-to-world rotations
    p: np.ndarray  # (M,3) initial metric positions
    v: np.ndarray  # (M,3) initial velocities
    points: np.ndarray  # (P,3) initial metric landmarks
    obs: np.ndarray  # (K,) indices into the model's observations
    obs_kf: np.ndarray  # (K,) keyframe index (into key_ts) of each used observation
    obs_pt: np.ndarray  # (K,) landmark index of each
    obs_xy: np.ndarray  # (K,2)


def _build(gsam, pr: _Problem, imu_t: np.ndarray, acc: np.ndarray, gyr: np.ndarray, params, bias0,
           camera: list[float], opt: VibaOptions, keep: np.ndarray):
    """The factor graph and initial values (keep: bool per observation)."""
    X, V, B, L = (gsam.symbol_shorthand.X, gsam.symbol_shorthand.V, gsam.symbol_shorthand.B,
                  gsam.symbol_shorthand.L)
    graph, vals = gsam.NonlinearFactorGraph(), gsam.Values()
    for k in range(len(pr.key_ts)):
        vals.insert(X(k), gsam.Pose3(gsam.Rot3(pr.R_wc[k]), pr.p[k]))
        vals.insert(V(k), pr.v[k])
        vals.insert(B(k), bias0)
    graph.add(gsam.PriorFactorPose3(X(0), vals.atPose3(X(0)), gsam.noiseModel.Isotropic.Sigma(6, 1e-6)))
    graph.add(gsam.PriorFactorVector(V(0), pr.v[0], gsam.noiseModel.Isotropic.Sigma(3, 1.0)))
    graph.add(gsam.PriorFactorConstantBias(B(0), bias0, gsam.noiseModel.Diagonal.Sigmas(
        np.array([0.2, 0.2, 0.2] + [opt.gyro_bias_prior] * 3))))
    across = crosses_gap(gap_spans(imu_t), pr.key_ts[:-1], pr.key_ts[1:])  # intervals reaching into an IMU gap
    for k in range(len(pr.key_ts) - 1):
        if not across[k]:
            pim = _preintegrate(gsam, params, bias0, imu_t, acc, gyr, pr.key_ts[k], pr.key_ts[k + 1])
            graph.add(gsam.CombinedImuFactor(X(k), V(k), X(k + 1), V(k + 1), B(k), B(k + 1), pim))
        else:  # nothing measured there: the bias's random walk alone ties the two ends
            rw = np.sqrt(pr.key_ts[k + 1] - pr.key_ts[k]) * np.repeat([opt.accel_bias_rw, opt.gyro_bias_rw], 3)
            graph.add(gsam.BetweenFactorConstantBias(B(k), B(k + 1), gsam.imuBias.ConstantBias(),
                                                     gsam.noiseModel.Diagonal.Sigmas(rw)))
    for j in (np.flatnonzero((np.r_[True, across] & np.r_[across, True])[1:]) + 1).tolist():  # no IMU factor
        graph.add(gsam.PriorFactorVector(V(j), pr.v[j], gsam.noiseModel.Isotropic.Sigma(3, 1.0)))  # reaches these
    f, cx, cy, k1 = (list(camera) + [0.0] * 4)[:4]
    K = gsam.Cal3Bundler(f, k1, 0.0, cx, cy)  # COLMAP's SIMPLE_RADIAL: u = cx + f (1 + k1 r^2) x
    noise = gsam.noiseModel.Robust.Create(gsam.noiseModel.mEstimator.Huber.Create(opt.huber_k),
                                          gsam.noiseModel.Isotropic.Sigma(2, opt.pixel_sigma))
    K_fixed = gsam.Cal3DS2(f, f, 0.0, cx, cy, k1, 0.0, 0.0, 0.0)  # the same model, held
    C = gsam.symbol_shorthand.K(0)
    if opt.refine_camera:  # f and k1 free (loose priors), k2 held at 0 (SIMPLE_RADIAL has none)
        vals.insert(C, K)
        graph.add(gsam.PriorFactorCal3Bundler(C, K, gsam.noiseModel.Diagonal.Sigmas(
            np.array([0.05 * f, 0.05, 1e-6]))))
    used = np.unique(pr.obs_pt[keep])
    weak = gsam.noiseModel.Isotropic.Sigma(3, opt.landmark_prior)
    for j in used:
        vals.insert(L(int(j)), pr.points[j])
        graph.add(gsam.PriorFactorPoint3(L(int(j)), pr.points[j], weak))
    for kf, pt, xy in zip(pr.obs_kf[keep], pr.obs_pt[keep], pr.obs_xy[keep]):
        if opt.refine_camera:
            graph.add(gsam.GeneralSFMFactor2Cal3Bundler(xy, noise, X(int(kf)), L(int(pt)), C))
        else:
            graph.add(gsam.GenericProjectionFactorCal3DS2(xy, noise, X(int(kf)), L(int(pt)), K_fixed))
    return graph, vals


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """GTSAM's projection factors print every cheirality exception (a point behind a
    camera while LM tries a step) to the C++ stdout: thousands of lines on a bad
    model, which would bury the CLI's one-line answer. The solve's file descriptor 1
    goes to /dev/null meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(null)
        os.close(saved)


def _solve(gsam, graph, vals, max_iterations: int):
    params = gsam.LevenbergMarquardtParams()
    params.setMaxIterations(max_iterations)
    params.setRelativeErrorTol(_TOL)
    with _quiet_stdout():
        return gsam.LevenbergMarquardtOptimizer(graph, vals, params).optimize()


def _solved_camera(gsam, res, camera: list[float]) -> list[float]:
    """[f, cx, cy, k1] after the solve (the SfM's when the camera is not refined)."""
    C = gsam.symbol_shorthand.K(0)
    if not res.exists(C):
        return list(camera)
    K = res.atCal3Bundler(C)
    return [float(K.fx()), float(K.px()), float(K.py()), float(K.k1())]


def _reprojection(gsam, pr: _Problem, res, camera: list[float]) -> np.ndarray:
    """(K,) pixel error of every candidate observation at the solution (inf where its
    landmark is absent or behind the camera)."""
    X, L = gsam.symbol_shorthand.X, gsam.symbol_shorthand.L
    f, cx, cy, k1 = _solved_camera(gsam, res, camera)
    err = np.full(len(pr.obs_kf), np.inf)
    poses = [res.atPose3(X(k)) for k in range(len(pr.key_ts))]
    Rs = np.stack([P.rotation().matrix() for P in poses])
    ts = np.stack([P.translation() for P in poses])
    have = np.array([res.exists(L(int(j))) for j in range(len(pr.points))])
    pts = np.stack([res.atPoint3(L(int(j))) if have[j] else np.zeros(3) for j in range(len(pr.points))])
    pc = np.einsum("nji,nj->ni", Rs[pr.obs_kf], pts[pr.obs_pt] - ts[pr.obs_kf])  # camera frame: R_wc^T (P - p)
    ok = have[pr.obs_pt] & (pc[:, 2] > 1e-6)
    uv = pc[:, :2] / np.where(ok, pc[:, 2], 1.0)[:, None]
    r2 = np.sum(uv**2, axis=1)
    pix = f * uv * (1 + k1 * r2)[:, None] + np.array([cx, cy])
    err[ok] = np.linalg.norm(pix[ok] - pr.obs_xy[ok], axis=1)
    return err


def _problem(key_ts: np.ndarray, key_T: np.ndarray, inside: np.ndarray, model, R_ic: np.ndarray, scale0: float,
             opt: VibaOptions, imu: tuple[np.ndarray, np.ndarray]) -> _Problem:
    """The keyframes inside the IMU span, scaled by `scale0`, and the observations
    of well-tracked points among them (model: an `SfmModel` whose names are the
    keyframes in `key_T`'s order)."""
    idx = np.nonzero(inside)[0]
    kf_of_image = np.full(len(key_T), -1)
    kf_of_image[idx] = np.arange(len(idx))
    obs = select_tracks(model.obs_image, model.obs_point, inside, opt.min_track, opt.max_points)
    p = scale0 * key_T[idx, :3, 3]
    v = np.gradient(p, key_ts[idx], axis=0) if len(idx) > 1 else np.zeros_like(p)
    obs_kf = kf_of_image[model.obs_image[obs]]
    xy = model.obs_xy[obs].astype(np.float64)
    if opt.rolling_shutter and len(obs):
        w = np.stack([np.interp(key_ts[idx], imu[0], imu[1][:, i]) for i in range(3)], axis=1) @ R_ic  # R_ci w
        w[stretch_of(gap_spans(imu[0]), key_ts[idx]) < 0] = 0.0  # a keyframe in an IMU gap: its rate is unknown
        xy = rolling_shutter_correct(xy, w[obs_kf], list(model.camera), opt.rolling_shutter)
    return _Problem(key_ts=key_ts[idx], R_wc=key_T[idx, :3, :3], p=p, v=v, points=scale0 * model.points_xyz,
                    obs=obs, obs_kf=obs_kf, obs_pt=model.obs_point[obs], obs_xy=xy)


def solve_viba(
    key_ts: np.ndarray, key_T: np.ndarray, model, imu_t: np.ndarray, accel_g: np.ndarray, gyro: np.ndarray, *,
    offset: float, R_ic: np.ndarray, gyro_bias: np.ndarray, scale0: float, accel_sign: float = 1.0,
    accel_bias: np.ndarray | None = None, gravity: np.ndarray | None = None, options: VibaOptions | None = None,
    lever_arm: np.ndarray | None = None,
) -> VibaResult:
    """Refined metric keyframe poses and the scale (see the module docstring).

    key_ts / key_T: the registered keyframes' times (frame clock) and SfM camera-to-
    world poses, in the order of `model.names`; accel_g in g (gravity removed unless
    `gravity`, the world's gravity in the SfM frame in m/s^2, is given), gyro rad/s;
    offset / R_ic / gyro_bias from `align_imu`; scale0, accel_sign, accel_bias (m/s^2,
    the accelerometer's own sign) from the windowed solve or a coarse search;
    lever_arm (m): the IMU's position in the camera frame where the windowed solve
    found one (`at_camera_centre`)."""
    import gtsam as gsam

    opt = options or VibaOptions()
    t0 = time.perf_counter()
    t = np.asarray(imu_t, dtype=np.float64) - offset
    acc = accel_sign * np.asarray(accel_g, dtype=np.float64) * GRAVITY
    gyr = np.asarray(gyro, dtype=np.float64)
    omega = gyr - np.asarray(gyro_bias, dtype=np.float64)
    lever = None if lever_arm is None else np.asarray(lever_arm, dtype=np.float64)

    def accel_at_centre(r: np.ndarray | None) -> np.ndarray:
        return acc if r is None else at_camera_centre(t, acc, omega, np.asarray(R_ic) @ r)
    key_ts = np.asarray(key_ts, dtype=np.float64)
    inside = (key_ts >= t[0]) & (key_ts <= t[-1])
    if inside.sum() < 4 or not (scale0 > 0):
        raise VibaError(f"only {int(inside.sum())} keyframes inside the IMU recording, or no starting scale")
    acc_d, gyr_d = imu_noise_densities(t, acc, gyr)
    params = _params(gsam, acc_d, gyr_d, np.zeros(3) if gravity is None else np.asarray(gravity), R_ic, opt)
    b_acc = np.zeros(3) if accel_bias is None else accel_sign * np.asarray(accel_bias, dtype=np.float64)
    bias0 = gsam.imuBias.ConstantBias(b_acc, np.asarray(gyro_bias, dtype=np.float64))
    key_T = np.asarray(key_T, dtype=np.float64)

    def run(o: VibaOptions, passes: int, shift: float = 0.0, r: np.ndarray | None = None):
        ts = t - shift  # the IMU samples in the frame clock at offset + shift
        pr = _problem(key_ts, key_T, inside, model, np.asarray(R_ic), scale0, o, (ts, omega))
        if len(pr.obs) < 30:
            raise VibaError(f"only {len(pr.obs)} observations of points tracked over {o.min_track}+ keyframes")
        return (pr, *_passes(gsam, pr, ts, accel_at_centre(r), gyr, params, bias0, [float(c) for c in model.camera],
                             o, passes))

    def quick(readout: float, shift: float, r: np.ndarray | None = lever) -> tuple[float, float]:
        """(visual chi^2 per row, the whole cost) of one pass on the longest tracks."""
        _pr, graph, res, _keep = run(replace(opt, max_points=min(opt.max_points, 300), max_iterations=8,
                                             rolling_shutter=readout), 1, shift, r)
        _imu, vis, total, rows = _chi2(graph, res)
        return vis / max(rows, 1), total

    shift = 0.0
    if opt.offset_search > 0:
        shift, readout = best_timing(quick, opt.rolling_shutter, opt.offset_search, VibaError)
        opt = replace(opt, rolling_shutter=readout)
    elif opt.rolling_shutter is None:
        opt = replace(opt, rolling_shutter=estimate_readout(lambda r: quick(r, 0.0)[0]))
    if lever is not None and opt.lever_search > 0:
        lever = best_lever(lambda r: quick(float(opt.rolling_shutter or 0.0), shift, r)[1], lever, opt.lever_search,
                           VibaError)
    pr, graph, res, keep = run(opt, 2, shift, lever)
    out = _result(gsam, graph, res, pr, key_ts, key_T, inside, [float(c) for c in model.camera], keep, t0)
    # GTSAM's accelerometer bias is in the signed samples' frame; the windowed solve's (and metadata's) is not
    return replace(out, rolling_shutter=float(opt.rolling_shutter or 0.0), accel_bias=accel_sign * out.accel_bias,
                   offset_shift=shift, lever_arm=lever)


_TOL = 1e-4  # relative error decrease at which LM stops (1e-6 cost 2x the time for < 0.01% of scale)
def _passes(gsam, pr: _Problem, t: np.ndarray, acc: np.ndarray, gyr: np.ndarray, params, bias0,
            camera: list[float], opt: VibaOptions, passes: int):
    """(graph, solution, kept observations): a robust solve, then (passes = 2) again
    without the observations it left more than `outlier_px` off."""
    keep = np.ones(len(pr.obs), dtype=bool)
    graph, vals = _build(gsam, pr, t, acc, gyr, params, bias0, camera, opt, keep)
    res = _solve(gsam, graph, vals, opt.max_iterations)
    if passes < 2:
        return graph, res, keep
    err = _reprojection(gsam, pr, res, camera)
    keep = err < opt.outlier_px
    counts = np.bincount(pr.obs_pt[keep], minlength=len(pr.points))
    keep &= counts[pr.obs_pt] >= opt.min_track  # a point left with fewer keyframes is dropped whole
    graph, vals = _build(gsam, pr, t, acc, gyr, params, bias0, camera, opt, keep)
    res = _solve(gsam, graph, _warm_start(gsam, vals, res), opt.max_iterations)
    return graph, res, keep


def _warm_start(gsam, vals, res):
    """The first pass's solution for every variable the second graph still has."""
    out = gsam.Values()
    for key in vals.keys():
        src = res if res.exists(key) else vals
        ch = chr(gsam.Symbol(key).chr()).upper()
        if ch == "X":
            out.insert(key, src.atPose3(key))
        elif ch == "V":
            out.insert(key, src.atVector(key))
        elif ch == "B":
            out.insert(key, src.atConstantBias(key))
        elif ch == "K":
            out.insert(key, src.atCal3Bundler(key))
        else:
            out.insert(key, src.atPoint3(key))
    return out


def _chi2(graph, res) -> tuple[float, float, float, int]:
    """(IMU chi^2, visual chi^2, total chi^2, visual rows) at the solution (quiet: a
    point behind a camera prints, as in `_solve`; the offset search meets many)."""
    imu = vis = 0.0
    rows = 0
    with _quiet_stdout():
        errors = [(type(f).__name__, 2.0 * f.error(res)) for f in (graph.at(i) for i in range(graph.size()))]
    for name, e in errors:
        if "CombinedImu" in name:
            imu += e
        elif "Projection" in name or "SFMFactor" in name:
            vis += e
            rows += 2
    return imu, vis, imu + vis, rows


def _scale_std(gsam, graph, res, pr: _Problem, centres: np.ndarray, birge: float) -> float:
    """std of the sim(3) scale from the marginal covariance of the keyframe positions
    (the module docstring): w_k = (c_k - c_mean) / sum |c - c_mean|^2 on the world-frame
    position, mapped to GTSAM's body-frame translation tangent by R_k; var = w^T H^-1 w.
    With H = R^T R from eliminating the linearised graph, that is |R^-T w|^2, one
    triangular solve (`backSubstituteTranspose`): the same number as
    Marginals.jointMarginalCovariance of every keyframe (a 30 s session: equal to 6
    digits) for 0.35 CPU-s instead of 2.5."""
    X = gsam.symbol_shorthand.X
    c = centres - centres.mean(0)
    den = float(np.sum(c**2))
    poses = {X(k): k for k in range(len(pr.key_ts))}
    w = gsam.VectorValues()
    for key in res.keys():
        if key in poses:  # GTSAM's Pose3 tangent: (rotation, body-frame translation)
            w.insert(key, np.r_[np.zeros(3), res.atPose3(key).rotation().matrix().T @ c[poses[key]] / den])
        else:
            w.insert(key, np.zeros(_TANGENT[chr(gsam.Symbol(key).chr()).upper()]))
    with _quiet_stdout():
        linear = graph.linearize(res)
    var = float(np.sum(np.square(linear.eliminateSequential().backSubstituteTranspose(w).vector())))
    return float(np.sqrt(max(var, 0.0) * max(birge, 1.0)))


_TANGENT = {"X": 6, "V": 3, "B": 6, "K": 3, "L": 3}  # pose, velocity, IMU bias, Cal3Bundler, point


def _result(gsam, graph, res, pr: _Problem, key_ts: np.ndarray, key_T: np.ndarray, inside: np.ndarray,
            camera: list[float], keep: np.ndarray, t0: float) -> VibaResult:
    """Poses, scale, its std and the consistency numbers from the solved graph."""
    X, B = gsam.symbol_shorthand.X, gsam.symbol_shorthand.B
    n = len(pr.key_ts)
    Rwc = np.stack([res.atPose3(X(k)).rotation().matrix() for k in range(n)])
    p = np.stack([res.atPose3(X(k)).translation() for k in range(n)])
    centres = key_T[inside, :3, 3]
    s, R, tt = umeyama(centres, p)
    T = key_T.copy()  # keyframes outside the IMU span: the SfM pose through the fitted similarity
    T[:, :3, :3] = R @ key_T[:, :3, :3]
    T[:, :3, 3] = s * key_T[:, :3, 3] @ R.T + tt
    T[inside, :3, :3] = Rwc
    T[inside, :3, 3] = p
    imu, vis, total, rows = _chi2(graph, res)
    n_pts = len(np.unique(pr.obs_pt[keep]))
    n_imu = sum("CombinedImu" in type(graph.at(i)).__name__ for i in range(graph.size()))  # n - 1 without a gap
    dof = max(15 * n_imu + rows - (15 * n + 3 * n_pts - 15), 1)
    birge = total / dof
    std = _scale_std(gsam, graph, res, pr, centres, birge)
    err = _reprojection(gsam, pr, res, camera)[keep]
    bias = res.atConstantBias(B(0))
    return VibaResult(
        T_wc=T, scale=float(s), rel_std=std / float(s), imu_chi2=imu / max(15 * n_imu, 1),
        visual_chi2=vis / max(rows, 1), reprojection_rms=float(np.sqrt(np.mean(err**2))) if len(err) else np.inf,
        inlier_fraction=float(keep.mean()) if len(keep) else 0.0, n_points=n_pts, n_observations=int(keep.sum()),
        accel_bias=np.asarray(bias.accelerometer()), gyro_bias=np.asarray(bias.gyroscope()),
        seconds=time.perf_counter() - t0, camera=_solved_camera(gsam, res, camera),
    )
