"""The hard-world profiles of `packer synth` (`--effect`, `--profile`): which camera
effects and which motion a synthetic session gets. Plain data with no numpy or
OpenCV, so the CLI can offer the choices without importing the renderer
(`packer.synth.camera` draws them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

LENS_FOCAL = 1.03  # true focal / calib.txt's
LENS_PP = (1.0, -1.0)  # true principal point - calib.txt's, px
LENS_K1 = -0.10
LOW_TEXTURE_GRAIN = 3.0  # grey levels (std) of the plain surfaces' grain
EFFECTS = ("glove", "lens", "blur", "rolling-shutter", "exposure", "low-texture")


@dataclass(frozen=True)
class CameraEffects:
    """Which effects a session's frames get (all off: the ideal camera)."""

    glove: bool = False
    lens: bool = False
    blur: float = 0.0  # exposure time, s (0: sharp)
    rolling_shutter: float = 0.0  # readout time top to bottom row, s (0: global shutter)
    exposure: bool = False
    low_texture: float = 0.0  # grain std in grey levels on the plain surfaces (0: all textured)
    photos: bool = False  # the room papered with real photographs (`packer.synth.photos`; needs scikit-image)

    @property
    def any(self) -> bool:
        return self != CameraEffects()

    def describe(self) -> dict:
        d = asdict(self)
        if not self.photos:
            d.pop("photos")  # the truth of every session rendered before stays as it was
        if self.lens:
            d.update(lens_focal=LENS_FOCAL, lens_principal_point=list(LENS_PP), lens_k1=LENS_K1)
        return d

    @classmethod
    def from_names(cls, names: list[str] | tuple[str, ...]) -> CameraEffects:
        """`packer synth --effect NAME` values (EFFECTS) at the hard benchmark's levels."""
        bad = [n for n in names if n not in EFFECTS]
        if bad:
            raise ValueError(f"unknown camera effect(s) {', '.join(bad)} (known: {', '.join(EFFECTS)})")
        return cls(glove="glove" in names, lens="lens" in names, blur=0.008 if "blur" in names else 0.0,
                   rolling_shutter=0.020 if "rolling-shutter" in names else 0.0, exposure="exposure" in names,
                   low_texture=LOW_TEXTURE_GRAIN if "low-texture" in names else 0.0)


@dataclass(frozen=True)
class PhoneRig:
    """How the phone itself is built and starts recording, beyond its camera (all off:
    the IMU at the optical centre, frame 0 10-40 ms after the IMU's first sample, the
    principal point at the image centre). Each session draws its own values within
    these (`packer.synth.spec.SessionSpec.phone`)."""

    lever_arm: float = 0.0  # m, the IMU's largest distance from the optical centre (a phone: 3-8 cm)
    imu_lead: tuple[float, float] = (0.0, 0.0)  # s, the IMU starts this much longer before frame 0 (drawn in)
    principal_offset: float = 0.0  # px, the principal point's largest distance from the image centre (calib.txt
    # carries it, as the app writes the intrinsic matrix AVFoundation delivers)

    @property
    def any(self) -> bool:
        return self != PhoneRig()


ALL_EFFECTS = CameraEffects.from_names(EFFECTS)
# the SLAM benchmark's profiles: (motion, effects)
PROFILES: dict[str, tuple[str, CameraEffects]] = {
    "easy": ("hand", CameraEffects()),
    "fast": ("fast", CameraEffects()),
    "glove": ("hand", CameraEffects(glove=True)),
    "lens": ("hand", CameraEffects(lens=True)),
    "blur-rs": ("hand", CameraEffects(blur=0.008, rolling_shutter=0.020)),
    "exposure": ("hand", CameraEffects(exposure=True)),
    "low-texture": ("hand", CameraEffects(low_texture=LOW_TEXTURE_GRAIN)),
    "all": ("fast", ALL_EFFECTS),
    "fast-phone": ("vigorous", CameraEffects()),
    "fast-phone-all": ("vigorous", ALL_EFFECTS),
    # a room papered with photographs, every camera effect but plain surfaces, fast hand, a real phone's build
    "photos": ("fast", CameraEffects(glove=True, lens=True, blur=0.008, rolling_shutter=0.020, exposure=True,
                                     photos=True)),
}
# the phone's build per profile (PhoneRig() where absent): a fast session made elsewhere was accepted 19% off,
# and a lever arm this size at these speeds is what our own renders had never shown the stage
PHONE = PhoneRig(lever_arm=0.08, imu_lead=(0.05, 0.3), principal_offset=15.0)
PHONE_RIGS: dict[str, PhoneRig] = {"fast-phone": PHONE, "fast-phone-all": PHONE, "photos": PHONE}
