"""Structure from motion with pycolmap (the wheel ships COLMAP; no CLI install).

Correspondences come from one of two front-ends: KLT tracks (`packer.slam.frontend.tracks`,
the default: the frames are a video, so following corners is ~10x cheaper than
describing and matching them) written into COLMAP's database and geometrically
verified by COLMAP, or SIFT with sequential matching (the COLMAP way, kept as the
`--frontend sift` option and the benchmark's baseline). Then the global mapper
(GLOMAP) by default or the incremental mapper. Known intrinsics from
calib.txt fix a PINHOLE camera and are not refined. The largest model wins; the
sizes of the others are reported. Everything runs in a scratch directory that is
removed afterwards: the session directory only ever receives the final poses."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.slam.frontend.tracks import Tracks

MAPPERS = ("global", "incremental")
FRONTENDS = ("klt", "sift")


class SfmError(ValueError):
    """SfM could not produce a usable model; str() says why (caller adds the session)."""


@dataclass
class SfmOptions:
    mapper: str = "global"
    frontend: str = "klt"  # "klt" (tracks given to `reconstruct`) | "sift"
    threads: int = 2  # geometric verification (per pair, seeded: the same result on any number); the rest: SERIAL
    max_features: int = 2048
    first_octave: int = 0  # 0: native resolution; -1 upsamples (about 3x slower)
    overlap: int = 5  # sequential matching: each image against the next `overlap` (+ quadratic)
    seed: int = 0
    tracks_per_view: int = 200  # GLOMAP global positioning: tracks kept per image (speed)
    retriangulate: bool = True  # GLOMAP retriangulation + refinement: ~3-7x lower ATE, steadier scale
    min_features: int = 64  # median SIFT features per image below this -> "no texture"
    min_tracked: int = 24  # median tracked corners per keyframe below this -> "no texture" (KLT keeps only
    # corners above an absolute strength floor, so a plain, blurred frame has tens, not hundreds)
    verify_trials: int = 50  # KLT: RANSAC trials at least (20 let a camera-rigid point set pass as a geometry;
    # the tracker now drops those itself, and 200 cost 17 s of a 30 s session)
    refine_intrinsics: bool = True  # calib.txt as the start of a SIMPLE_RADIAL camera whose focal length and k1
    # bundle adjustment refines (the user's own COLMAP settings): calib.txt is the app's nominal matrix
    hold_rotations: bool = False  # global mapper with the gyro's rotations (tracks.rotations): its bundle
    # adjustments keep them (the start of `packer.slam.repair.gyro_repair`)


@dataclass
class SfmModel:
    """The largest reconstruction, as plain arrays (picklable across processes)."""

    names: list[str]  # registered image names (keyframe file names), sorted by name
    R_cw: np.ndarray  # (M,3,3) world-to-camera rotations (COLMAP cam_from_world)
    t_cw: np.ndarray  # (M,3)
    reprojection_error: float  # mean, pixels
    n_points: int
    median_depth: float  # median depth of 3-D points seen by the registered images (SfM units)
    other_models: list[int] = field(default_factory=list)  # registered images in the other models
    n_images: int = 0  # images given to SfM
    median_features: float = 0.0
    camera: list[float] = field(default_factory=list)  # the camera's model parameters after bundle adjustment
    frontend_note: str = ""  # set when another front-end than the one asked for made this model
    chunks: list[dict] = field(default_factory=list)  # a long session mapped in parts: how each was joined
    rolling_shutter: float | None = None  # s, the readout the tracks were corrected for (`rolling.py`)
    rolling_shutter_curve: dict = field(default_factory=dict)  # candidate ms -> gyro disagreement when measured
    tracks: Tracks | None = None  # the KLT tracks it was built from, rolling shutter taken out (one-part models)
    gyro_starts: dict[str, Any] = field(default_factory=dict)  # other gyro alignments (`imu_align.ImuAlignment`)
    # `gyro_repair` may start from: the rolling-shutter measurement's best window SfM, the KLT model SIFT replaced
    clusters: list[SfmModel] = field(default_factory=list)  # mapped on the gyro's rotations (`hold_rotations`):
    # the other models GLOMAP's pruning split off, largest first (covisibility clusters; `repaired` maps them as parts)
    check_R_wc: np.ndarray | None = None  # (M,3,3) a model whose rotations are the gyro's (`gyro_repair`): the
    # rotations its images want, in the registered keyframes' time order; the gyro check is made on these
    # the structure, compact, for the visual-inertial bundle adjustment (`packer.slam.inertial.viba`): 3-D points
    # (P,3) and every observation as (image index into names, point index, pixel x, y) in (K,) / (K,2) arrays
    points_xyz: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    obs_image: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    obs_point: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    obs_xy: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.float32))

    def registered(self, names: list[str], kpos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(kpos of the registered ones among `names`, their camera-to-world (M,4,4)),
        in the order given (time order for keyframes)."""
        where = {n: i for i, n in enumerate(self.names)}
        T_all = self.camera_to_world()
        rows = [(int(k), where[n]) for k, n in zip(kpos, names) if n in where]
        return (np.asarray([k for k, _ in rows], dtype=np.int64),
                np.asarray([T_all[i] for _, i in rows]).reshape(-1, 4, 4))

    def camera_to_world(self) -> np.ndarray:
        """(M,4,4) camera-to-world poses (the inverse of COLMAP's cam_from_world)."""
        T = np.tile(np.eye(4), (len(self.names), 1, 1))
        Rwc = np.swapaxes(self.R_cw, -1, -2)
        T[:, :3, :3] = Rwc
        T[:, :3, 3] = -np.einsum("nij,nj->ni", Rwc, self.t_cw)
        return T


@contextlib.contextmanager
def _quiet_glog() -> Iterator[None]:
    """COLMAP logs every step (and its own view of a failure) through glog on stderr;
    the stage reports failures itself, so only fatal messages get through unless
    SHARDSHIP_COLMAP_LOG (0 info .. 3 fatal) asks for more."""
    import pycolmap

    old = pycolmap.logging.minloglevel
    try:
        level = int(os.environ.get("SHARDSHIP_COLMAP_LOG", "3"))
    except ValueError:
        level = 3
    pycolmap.logging.minloglevel = level
    try:
        yield
    finally:
        pycolmap.logging.minloglevel = old


def reconstruct(
    image_dir: Path,
    image_names: list[str],
    intrinsics: tuple[float, float, float, float] | None,
    options: SfmOptions | None = None,
    stage: Callable[[str], None] | None = None,
    workdir: Path | None = None,
    tracks: Tracks | None = None,
) -> SfmModel:
    """SfM over `image_names` (relative to image_dir); returns the largest model.
    `tracks` (KLT front-end: what each of those images sees) replaces SIFT and
    matching. `stage(name)` is called as each stage starts (progress bars)."""
    import pycolmap

    opt = options or SfmOptions()
    if opt.mapper not in MAPPERS:
        raise ValueError(f"mapper must be one of {MAPPERS}, got {opt.mapper!r}")
    note = stage or (lambda _s: None)
    pycolmap.set_random_seed(opt.seed)
    with tempfile.TemporaryDirectory(prefix="shardship-sfm-", dir=workdir) as tmp, _quiet_glog():
        db = Path(tmp) / "database.db"
        out = Path(tmp) / "sparse"
        out.mkdir()
        reader = pycolmap.ImageReaderOptions()
        radial = None if intrinsics is None else _radial_start(intrinsics, opt)
        refine = intrinsics is None or radial is not None
        if intrinsics is None:
            reader.camera_model = "SIMPLE_RADIAL"
        elif radial is not None:
            reader.camera_model = "SIMPLE_RADIAL"
            reader.camera_params = radial
        else:
            reader.camera_model = "PINHOLE"
            reader.camera_params = ",".join(f"{v:.9g}" for v in intrinsics)
        if tracks is None:
            note("features")
            _sift_features(pycolmap, db, image_dir, image_names, reader, opt)
        counts = _feature_counts(db) if tracks is None else [len(p) for p in tracks.points]
        median_features = float(np.median(counts)) if counts else 0.0
        if median_features < (opt.min_features if tracks is None else opt.min_tracked):
            raise SfmError(
                f"frames have almost no features (median {median_features:.0f} "
                f"{'SIFT keypoints' if tracks is None else 'tracked corners'} per keyframe, need "
                f"{opt.min_features if tracks is None else opt.min_tracked}): blank, blurred or textureless images"
            )
        note("matching")
        if tracks is None:
            _sift_matching(pycolmap, db, opt)
        else:
            _track_matches(pycolmap, db, image_dir, image_names, reader, tracks, opt)
        gyro = tracks is not None and tracks.rotations is not None and intrinsics is not None
        if gyro:
            assert tracks is not None and intrinsics is not None
            _gyro_geometries(pycolmap, db, image_names, tracks, intrinsics)
        note(f"mapping ({opt.mapper})")
        models = _map(pycolmap, db, image_dir, out, opt, fixed_intrinsics=not refine, gyro_poses=gyro)
        if not models:
            why = _gyro_diagnose(tracks) if gyro and tracks is not None else _diagnose(db)
            raise SfmError(f"SfM built no model from {len(image_names)} keyframes: {why}")
        sizes = sorted(((rec.num_reg_images(), k) for k, rec in models.items()), reverse=True)
        best = models[sizes[0][1]]
        model = _to_model(best)
        model.other_models = [n for n, _k in sizes[1:]]
        model.n_images = len(image_names)
        model.median_features = median_features
        if gyro and opt.hold_rotations:
            model.clusters = [_to_model(models[k]) for _n, k in sizes[1:]]
        return model


def _radial_start(intrinsics: tuple[float, float, float, float], opt: SfmOptions) -> str | None:
    """SIMPLE_RADIAL parameters 'f,cx,cy,0' from calib.txt when the focal length is
    to be refined and fx == fy (within 1%; the app writes one focal), else None."""
    fx, fy, cx, cy = intrinsics
    if not opt.refine_intrinsics or abs(fx - fy) > 0.01 * max(fx, fy):
        return None
    return f"{0.5 * (fx + fy):.9g},{cx:.9g},{cy:.9g},0"


SERIAL = 1  # threads for the mapper (its Ceres solves included) and the SIFT fallback's extraction and matching:
# with two, the order of Ceres' parallel sums and of the SIFT results varied between runs, so the same session gave
# different poses (1e-14 m apart on a good one; on a weak one a different model each run, accepted once, refused the
# next). Only the verification runs on `threads`: the same poses with one or two, and most of the speed (30 s
# session: 30.9 s against 35.8 s on one thread, quiet 2-core VM)


BA_FUNCTION_TOLERANCE = 1e-4  # the global mapper's bundle adjustments stop once an iteration lowers the cost by less
# than this share (COLMAP: 1e-5). Most of a long session's mapping is its retriangulation's repeated full adjustments:
# 30 s fast session 17.2 -> 13.3 s of mapping. On 30 10-s sessions (fast, glove, lens, seeds 3-12) the scale moved by a
# median 0.008% (worst 0.11%, 0.45 of its reported std, either sign) and the ATE by <= 0.003% of the path


def _sift_features(pycolmap, db: Path, image_dir: Path, image_names: list[str], reader, opt: SfmOptions) -> None:
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = SERIAL
    extraction.use_gpu = False
    extraction.sift.max_num_features = opt.max_features
    extraction.sift.first_octave = opt.first_octave
    pycolmap.extract_features(
        db,
        image_dir,
        image_names=image_names,
        camera_mode=pycolmap.CameraMode.SINGLE,
        reader_options=reader,
        extraction_options=extraction,
        device=pycolmap.Device.cpu,
    )


def _sift_matching(pycolmap, db: Path, opt: SfmOptions) -> None:
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = SERIAL
    matching.use_gpu = False
    pairing = pycolmap.SequentialPairingOptions()
    pairing.overlap = opt.overlap
    pairing.num_threads = SERIAL
    pycolmap.match_sequential(db, matching_options=matching, pairing_options=pairing, device=pycolmap.Device.cpu)


MIN_MATCHES = 15  # shared tracks (then inliers) a keyframe pair needs to enter the view graph (COLMAP's default),
# on the gyro's rotations too. There 6 were tried (a pair's geometry is then the gyro's rotation and a direction):
# a plain stretch with 9-13 shared corners no longer split the model, but became a weak link the std does not see
# (every-effect seed 11 from the true calibration: one model of 94/98 keyframes, accepted 4.6% off at +-1.18%, its
# thirds each within 1.4%; split at 15, the parts are joined by the IMU with a join term, or refused)


def _track_matches(pycolmap, db: Path, image_dir: Path, image_names: list[str], reader, tracks: Tracks,
                   opt: SfmOptions) -> None:
    """Images, tracked corners as keypoints and shared tracks as matches between
    each keyframe and the next `overlap` ones, then COLMAP's geometric verification
    (E / F / H by RANSAC: the two-view geometries GLOMAP and `_diagnose` read)."""
    pycolmap.Database.open(str(db)).close()  # import_images wants the file to exist
    pycolmap.import_images(db, image_dir, pycolmap.CameraMode.SINGLE, image_names, reader)
    d = pycolmap.Database.open(str(db))
    try:
        ids = {im.name: im.image_id for im in d.read_all_images()}
        iid = [ids[n] for n in image_names]
        for a in range(len(image_names)):
            d.write_keypoints(iid[a], tracks.points[a])
            for b in range(a + 1, min(a + 1 + opt.overlap, len(image_names))):
                m = tracks.matches(a, b)
                if len(m) >= MIN_MATCHES:
                    d.write_matches(iid[a], iid[b], m)
    finally:
        d.close()
    verifier = pycolmap.GeometricVerifierOptions()
    verifier.num_threads = opt.threads
    two_view = pycolmap.TwoViewGeometryOptions()
    two_view.ransac.min_num_trials = opt.verify_trials
    two_view.ransac.random_seed = opt.seed
    two_view.detect_watermark = False  # a watermark moves with the image; tracked corners on one are outliers anyway
    pycolmap.geometric_verification(db, verifier, two_view_geometry_options=two_view)


def _gyro_geometries(pycolmap, db: Path, image_names: list[str], tracks: Tracks,
                     intrinsics: tuple[float, float, float, float]) -> None:
    """Every verified pair's relative pose from the gyro (`packer.slam.inertial.gyro_prior`):
    the rotation between the two keyframes' gyro orientations, the translation's
    direction from the pair's inlier matches with that rotation fixed."""
    from packer.slam.inertial.gyro_prior import bearings, translation_direction

    assert tracks.rotations is not None
    d = pycolmap.Database.open(str(db))
    try:
        pos = {n: k for k, n in enumerate(image_names)}
        where = {im.image_id: pos[im.name] for im in d.read_all_images()}
        C = pycolmap.TwoViewGeometryConfiguration
        pair_ids, geoms = d.read_two_view_geometries()
        for pid, g in zip(pair_ids, geoms):
            if g.config in (C.UNDEFINED, C.DEGENERATE):
                continue
            i1, i2 = pycolmap.pair_id_to_image_pair(pid)
            a, b = where[i1], where[i2]
            R = tracks.rotations[b].T @ tracks.rotations[a]  # cam_b from cam_a
            m = np.asarray(g.inlier_matches, dtype=np.int64).reshape(-1, 2)
            t = translation_direction(bearings(tracks.points[a][m[:, 0]], intrinsics),
                                      bearings(tracks.points[b][m[:, 1]], intrinsics), R)
            g.cam2_from_cam1 = pycolmap.Rigid3d(pycolmap.Rotation3d(R), t)
            g.config = C.CALIBRATED
            d.update_two_view_geometry(i1, i2, g)
    finally:
        d.close()


def _feature_counts(db: Path) -> list[int]:
    import pycolmap

    if hasattr(pycolmap.Database, "open"):
        d = pycolmap.Database.open(str(db))
    else:  # older pycolmap, without Database.open: its constructor took the path (the stubs are the new API's)
        d = pycolmap.Database(str(db))  # type: ignore[call-arg]
    try:
        return [int(d.num_keypoints_for_image(im.image_id)) for im in d.read_all_images()]
    finally:
        d.close()


def _diagnose(db: Path) -> str:
    """Why no model: read the verified two-view geometries. Identical frames give
    identity homographies; a camera turning in place gives pure-rotation
    (panoramic) pairs; anything else is too little overlap."""
    import pycolmap

    d = pycolmap.Database.open(str(db))
    try:
        _ids, geoms = d.read_two_view_geometries()
    finally:
        d.close()
    C = pycolmap.TwoViewGeometryConfiguration
    verified = [g for g in geoms if g.config not in (C.UNDEFINED, C.DEGENERATE)]
    if not verified:
        return "no two keyframes share enough features (fast motion, blur, or --keyframe-step too large)"
    rot = [g for g in verified if g.config in (C.PANORAMIC, C.PLANAR_OR_PANORAMIC)]
    still = [g for g in rot if _is_identity(np.asarray(g.H))]
    if len(still) >= 0.9 * len(verified):
        return (f"the frames are identical ({len(still)}/{len(verified)} keyframe pairs show no motion at all): "
                "the camera does not move")
    if len(rot) >= 0.9 * len(verified):
        return (f"no parallax: {len(rot)}/{len(verified)} keyframe pairs are pure rotations (the camera turns in "
                "place without translating), so neither the 3-D structure nor a metric scale can be recovered")
    return (f"only {len(verified) - len(rot)}/{len(verified)} keyframe pairs have parallax; "
            "try a smaller --keyframe-step or record with more translation")


def _gyro_diagnose(tracks: Tracks) -> str:
    """Why no model on the gyro's rotations (every pair's geometry is the gyro's, so the
    database's pair types say nothing): corners followed too briefly to tie three
    keyframes, or relative poses that do not fit together."""
    _ids, views = np.unique(np.concatenate(tracks.ids), return_counts=True)
    long = int(np.sum(views >= 3))
    if long < 3 * len(tracks.keyframes):
        return (f"only {long} corners are followed through 3 keyframes or more (fast motion, blur or plain surfaces "
                "lose them sooner)")
    return ("the keyframe pairs' relative poses (the gyro's rotations, the tracks' directions) do not fit together: "
            "the gyro's calibration is off, or the tracks slide")


def _is_identity(H: np.ndarray, tol_px: float = 0.5) -> bool:
    """Homography moves the corners of a 480x360 image by less than tol_px."""
    if H.shape != (3, 3) or not np.all(np.isfinite(H)) or abs(H[2, 2]) < 1e-12:
        return False
    pts = np.array([[0, 0, 1], [480, 0, 1], [0, 360, 1], [480, 360, 1]], dtype=np.float64)
    q = pts @ (H / H[2, 2]).T
    q = q[:, :2] / q[:, 2:]
    return bool(np.max(np.abs(q - pts[:, :2])) < tol_px)


def _map(pycolmap, db: Path, image_dir: Path, out: Path, opt: SfmOptions, fixed_intrinsics: bool,
         gyro_poses: bool = False) -> dict:
    if opt.mapper == "global":
        o = pycolmap.GlobalPipelineOptions()
        o.decompose_relative_pose = not gyro_poses  # the gyro's relative poses are in the database already
        o.num_threads = SERIAL
        o.random_seed = opt.seed
        m = o.mapper
        m.num_threads = SERIAL
        m.random_seed = opt.seed
        m.global_positioning.use_gpu = False
        m.global_positioning.random_seed = opt.seed
        m.rotation_averaging.random_seed = opt.seed
        m.bundle_adjustment.ceres.use_gpu = False
        m.bundle_adjustment.ceres.solver_options.num_threads = SERIAL
        m.bundle_adjustment.ceres.solver_options.function_tolerance = BA_FUNCTION_TOLERANCE
        m.track_required_tracks_per_view = opt.tracks_per_view
        m.skip_retriangulation = not opt.retriangulate
        m.bundle_adjustment.refine_focal_length = not fixed_intrinsics
        m.bundle_adjustment.refine_principal_point = False
        m.bundle_adjustment.refine_extra_params = not fixed_intrinsics
        if opt.hold_rotations and gyro_poses:
            m.ba_skip_joint_optimization_stage = True  # rotations stay those of the gyro's relative poses
            m.bundle_adjustment.constant_rig_from_world_rotation = True
        return dict(pycolmap.global_mapping(db, image_dir, out, o))
    o = pycolmap.IncrementalPipelineOptions()
    o.num_threads = SERIAL
    o.random_seed = opt.seed
    o.mapper.num_threads = SERIAL
    o.mapper.random_seed = opt.seed
    o.triangulation.random_seed = opt.seed
    o.extract_colors = False
    o.ba_refine_focal_length = not fixed_intrinsics
    o.ba_refine_principal_point = False
    o.ba_refine_extra_params = not fixed_intrinsics
    return dict(pycolmap.incremental_mapping(db, image_dir, out, o))


def _to_model(rec) -> SfmModel:
    items = sorted(((img.name, img) for img in rec.images.values() if img.has_pose), key=lambda x: x[0])
    names = [n for n, _ in items]
    R = np.stack([np.asarray(img.cam_from_world().rotation.matrix()) for _, img in items])
    t = np.stack([np.asarray(img.cam_from_world().translation) for _, img in items])
    depths = []
    pid_index: dict[int, int] = {}
    xyz: list[np.ndarray] = []
    obs_i: list[int] = []
    obs_p: list[int] = []
    obs_xy: list[np.ndarray] = []
    for i, (_, img) in enumerate(items):
        cfw = img.cam_from_world()
        Rm, tv = np.asarray(cfw.rotation.matrix()), np.asarray(cfw.translation)
        seen = [p for p in img.points2D if p.has_point3D()]
        pts = [rec.points3D[p.point3D_id].xyz for p in seen]
        if pts:
            depths.append(np.median((np.asarray(pts) @ Rm.T + tv)[:, 2]))
        for p, x in zip(seen, pts):
            j = pid_index.setdefault(int(p.point3D_id), len(pid_index))
            if j == len(xyz):
                xyz.append(np.asarray(x, dtype=np.float64))
            obs_i.append(i)
            obs_p.append(j)
            obs_xy.append(np.asarray(p.xy, dtype=np.float32))
    return SfmModel(
        names=names,
        R_cw=R,
        t_cw=t,
        reprojection_error=float(rec.compute_mean_reprojection_error()),
        n_points=int(rec.num_points3D()),
        median_depth=float(np.median(depths)) if depths else float("nan"),
        points_xyz=np.asarray(xyz, dtype=np.float64).reshape(-1, 3),
        obs_image=np.asarray(obs_i, dtype=np.int32),
        obs_point=np.asarray(obs_p, dtype=np.int32),
        obs_xy=np.asarray(obs_xy, dtype=np.float32).reshape(-1, 2),
        camera=[float(v) for v in next(iter(rec.cameras.values())).params],
    )
