"""The camera side of a synthetic session: the room, the hand's path through it,
and the JPEG frames under `rgb/` (plus the ARKit app's single-point LiDAR depth,
which samples the same rendered geometry).

The camera constants are the app's ultrawide stream at a size the tests can render
quickly; the principal point follows COLMAP's pixel-centre convention because
calib.txt carries it in that convention."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from packer.synth import camera
from packer.synth.render import Renderer, Scene, make_scene
from packer.synth.trajectory import Trajectory, make_trajectory

if TYPE_CHECKING:
    from packer.synth.spec import SessionSpec

WIDTH, HEIGHT, FPS = 480, 360, 60.0
FX = FY = 400.0
CX, CY = 240.0, 180.0  # COLMAP convention: pixel (i, j) has its centre at (i + 0.5, j + 0.5)
JPEG_QUALITY = 80  # the app: UIImage.jpegData(compressionQuality: 0.8)
_DEPTH_MAP = (256, 192)  # ARKit sceneDepth resolution; the app takes a 5x5 median at its centre

_SCENES: dict[tuple[int, float, float, bool], Scene] = {}


def _scene(seed: int, scale: float, rng: np.random.Generator, plain_grain: float = 0.0, photos: bool = False) -> Scene:
    """make_scene, remembered for the last few (seed, scale, grain): texture generation
    is the slow part of a short session, and tests re-synthesise the same seed."""
    key = (seed, scale, plain_grain, photos)
    if key not in _SCENES:
        while len(_SCENES) >= 4:
            _SCENES.pop(next(iter(_SCENES)))
        _SCENES[key] = make_scene(rng, scale, plain_grain, photos)
    return _SCENES[key]


def principal_point(spec: SessionSpec) -> tuple[float, float]:
    """(cx, cy) of the session's camera (COLMAP convention, as calib.txt): the image
    centre, moved by the phone's drawn principal offset (`PhoneRig`)."""
    return CX + spec.phone.principal_offset[0], CY + spec.phone.principal_offset[1]


def _scaled(traj: Trajectory, s: float) -> Trajectory:
    return replace(traj, pos_amp=traj.pos_amp * s)


@dataclass(frozen=True)
class World:
    """What every later step samples: the room, the camera path, and the true
    camera-to-world pose at each frame index (dropped frames included)."""

    scene: Scene
    traj: Trajectory
    t_frames: np.ndarray  # (n_frames,) frame time slot / fps (i / fps without camera drops), s since frame 0
    poses: np.ndarray  # (n_frames, 4, 4) camera-to-world, metres, OpenCV camera
    renderer: Renderer


def build_world(spec: SessionSpec, g_scene: np.random.Generator, g_traj: np.random.Generator) -> World:
    """The room (of `scene_seed` when given, so several sessions share it) and a
    trajectory that looks at a random point on the table."""
    scale = spec.scale
    grain = spec.effects.low_texture
    if spec.scene_seed is None:
        scene = _scene(int(spec.seed), scale, g_scene, grain, spec.effects.photos)
    else:
        ss_scene = np.random.SeedSequence([int(spec.scene_seed), 0x5EED]).spawn(1)[0]
        scene = _scene(int(spec.scene_seed), scale, np.random.default_rng(ss_scene), grain, spec.effects.photos)
    table = scene.boxes[0]
    target = np.array(
        [
            (table.lo[0] + table.hi[0]) / 2 + g_traj.uniform(-0.2, 0.2) * scale,
            (table.lo[1] + table.hi[1]) / 2 + g_traj.uniform(-0.1, 0.3) * scale,
            table.hi[2],
        ]
    )
    start = np.array([g_traj.uniform(-0.1, 0.1), g_traj.uniform(-0.1, 0.1), g_traj.uniform(-0.1, 0.05)]) * scale
    traj = make_trajectory(g_traj, spec.motion, start, target)
    if scale != 1.0:
        traj = _scaled(traj, scale)
    t_frames = spec.slots.astype(np.float64) / spec.fps  # i / fps unless the camera dropped frames
    poses = traj.poses(t_frames)
    cx, cy = principal_point(spec)
    intr = camera.true_intrinsics(FX, FY, cx - 0.5, cy - 0.5, spec.effects)
    rays = camera.pixel_rays(WIDTH, HEIGHT, intr) if spec.effects.lens else None
    renderer = Renderer(scene, WIDTH, HEIGHT, FX, FY, cx - 0.5, cy - 0.5, rays_cam=rays)
    return World(scene, traj, t_frames, poses, renderer)


class _Camera:
    """One frame as the phone records it under `spec.effects` (`packer.synth.camera`)."""

    def __init__(self, spec: SessionSpec, world: World, joints: np.ndarray | None, rng: np.random.Generator):
        effects = spec.effects
        self.world, self.joints = world, joints
        self.bands = camera.row_bands(HEIGHT, effects.rolling_shutter)
        self.subs = camera.blur_offsets(effects.blur)
        cx, cy = principal_point(spec)
        k = camera.true_intrinsics(FX, FY, cx - 0.5, cy - 0.5, effects)
        self.K = np.array([[k[0], 0, k[2]], [0, k[1], k[3]], [0, 0, 1.0]])
        self.glove = camera.make_glove(rng, WIDTH, HEIGHT) if effects.glove else None
        self.exposure = camera.make_exposure(rng, len(spec.slots) / spec.fps) if effects.exposure else None

    def frame(self, i: int) -> np.ndarray:
        w, t = self.world, float(self.world.t_frames[i])
        if len(self.bands) == 1:
            img = w.renderer.render(w.poses[i])
        else:
            poses = w.traj.poses(np.array([t + dt for _rows, dt in self.bands]))
            img = w.renderer.render_bands([(rows, T) for (rows, _dt), T in zip(self.bands, poses)])
        if len(self.subs) > 1:
            img = camera.rotation_blur(img, w.poses[i][:3, :3], w.traj.rotation(t + self.subs), self.K)
        if self.glove is not None and self.joints is not None:
            img = camera.draw_glove(img, self.glove, self.joints[i])
        if self.exposure is not None:
            img = camera.apply_gains(img, self.exposure.gains(t))
        return img


def render_frames(rgb_dir: Path, spec: SessionSpec, world: World, joints: np.ndarray | None = None,
                  g_camera: np.random.Generator | None = None) -> int:
    """Write `rgb/NNNNNN.jpg` for every frame that was not dropped and return the
    bytes written (the placeholder video is sized from it). A static session
    renders once: every frame is the same image. `joints` (n_frames, 4) degrees
    move the glove's fingers when `spec.effects.glove`; `g_camera` draws the glove
    and the exposure changes."""
    cam = _Camera(spec, world, joints, g_camera or np.random.default_rng(0)) if spec.effects.any else None
    frames: Any = spec.present
    if spec.progress and sys.stderr.isatty():  # a per-frame bar only where it redraws in place
        from tqdm import tqdm

        frames = tqdm(frames, desc=spec.name, unit="frame", leave=False)
    params = [int(cv2.IMWRITE_JPEG_QUALITY), int(spec.jpeg_quality)]
    jpeg_bytes = 0
    static_jpg: bytes | None = None
    for i in frames:
        if static_jpg is None or spec.motion != "static" or cam is not None:
            img = world.renderer.render(world.poses[i]) if cam is None else cam.frame(i)
            ok, buf = cv2.imencode(".jpg", img[..., ::-1], params)
            if not ok:
                raise RuntimeError("JPEG encoding failed")
            static_jpg = buf.tobytes()
        (rgb_dir / f"{i:06d}.jpg").write_bytes(static_jpg)
        jpeg_bytes += len(static_jpg)
    return jpeg_bytes


def center_depth(renderer: Renderer, poses: np.ndarray) -> np.ndarray:
    """The ARKit app's single-point LiDAR depth per frame: median of the 5x5 centre
    pixels of the 256x192 depth map (z-depth, metres)."""
    w, h = _DEPTH_MAP
    xs = w // 2 + np.arange(-2, 3)
    ys = h // 2 + np.arange(-2, 3)
    u = (xs + 0.5) * WIDTH / w - 0.5  # depth-map pixel centre -> OpenCV image pixel coordinates
    v = (ys + 0.5) * HEIGHT / h - 0.5
    uv = np.stack(np.meshgrid(u, v), -1).reshape(-1, 2)
    out = np.empty(len(poses))
    for i, T in enumerate(poses):
        d = np.sort(renderer.depth(T, uv, FX, FY, CX - 0.5, CY - 0.5))
        out[i] = d[len(d) // 2]
    return out
