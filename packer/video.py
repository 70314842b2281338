"""video.mov, the app's own record of when each frame arrived: read and written here.

The app's VideoRecorder (AVAssetWriter, HEVC) appends every frame the camera
delivers, stamped with its presentation time relative to the first appended frame,
on a 1/600 s timescale (`CMTimeMakeWithSeconds(elapsed, 600)`). The JPEGs in rgb/
carry no time: their file number counts delivered frames. So the video's packet
times are the only record of a frame the camera dropped (a late frame never reaches
the app, the next one takes its number): a gap in the times where the numbering
runs on. It is also missing the odd frame the writer was not ready for
(`isReadyForMoreMediaData` false): a number with no sample.

Only packet headers are read (PyAV's demuxer; no decoding: the real file is
full-resolution HEVC, ~1 MB per second). `write` makes the same kind of file for
`packer synth`: a real QuickTime container with the app's timescale."""
from __future__ import annotations

import os
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import numpy as np

TIMESCALE = 600  # AVAssetWriter's preferredTimescale in the app
FILE = "video.mov"


class VideoError(ValueError):
    """video.mov cannot give frame times; the message says why (one line)."""


def frame_times(path: str | os.PathLike) -> np.ndarray:
    """Presentation times (s, sorted, the first 0) of every video sample in `path`,
    from the container's packet headers. Raises VideoError when the file is not a
    readable video (truncated copy, zero bytes, no video track)."""
    import av  # imported here: only sessions with a video need it

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError("has no video track")
            stream = container.streams.video[0]
            base = stream.time_base
            pts = [p.pts for p in container.demux(stream) if p.pts is not None and p.size]
    except av.FFmpegError as e:
        raise VideoError(f"unreadable ({e.strerror or type(e).__name__}); re-copy it from the phone") from None
    if base is None or len(pts) < 2:
        raise VideoError(f"holds {len(pts)} frame(s); re-copy it from the phone")
    t = np.sort(np.asarray(pts, dtype=np.int64))
    if np.any(np.diff(t) <= 0):
        raise VideoError("two frames share a presentation time; not the app's recording")
    return (t - t[0]).astype(np.float64) * float(base)


def ticks(times: np.ndarray) -> np.ndarray:
    """What the app's writer stores for frame times (s): elapsed since the first,
    rounded to the 1/600 s timescale."""
    t = np.asarray(times, dtype=np.float64)
    return np.round((t - t[0]) * TIMESCALE).astype(np.int64)


def write(path: str | os.PathLike, images: Iterable[np.ndarray], times: np.ndarray, *,
          width: int, height: int) -> None:
    """An HEVC QuickTime file of `images` (RGB uint8) at `times` (s), on the app's
    1/600 s timescale, bit-exact (the same bytes for the same input)."""
    import av

    pts = ticks(times)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    base = Fraction(1, TIMESCALE)
    with av.open(str(tmp), "w", format="mov",
                 options={"fflags": "+bitexact", "video_track_timescale": str(TIMESCALE)}) as out:
        stream = out.add_stream("libx265", rate=60)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = base
        stream.options = {"preset": "ultrafast", "x265-params": "log-level=error:frame-threads=1:pools=1"}
        for img, p in zip(images, pts):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = int(p), base
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    os.replace(tmp, path)
