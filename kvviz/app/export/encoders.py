"""Frames to files: a GIF through Pillow, an MP4 (H.264) through PyAV. Qt-free; Pillow and PyAV load
only when an encoder is made. Frames are (H, W, 3) uint8 RGB arrays, all of one size."""

from __future__ import annotations

import contextlib
import io
import math
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np

X264_OPTIONS = {"crf": "18", "preset": "medium", "tune": "stillimage"}  # crf 18: about visually lossless
BT709 = 1  # FFmpeg's number for BT.709 primaries, transfer and matrix alike


def padded(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """`rgb` grown to `height` x `width` by repeating its last row and column (the page's background)."""
    extra_rows, extra_columns = height - rgb.shape[0], width - rgb.shape[1]
    if extra_rows <= 0 and extra_columns <= 0:
        return rgb
    return np.pad(rgb, ((0, max(0, extra_rows)), (0, max(0, extra_columns)), (0, 0)), mode="edge")


class GifFrames:
    """GIF frames, kept zlib-compressed until the end; then one adaptive 256-colour palette is made from
    all of them (sampled, about PALETTE_SAMPLE pixels in all), every frame is mapped to it without
    dithering (flat cells stay flat), and Pillow stores each frame as the rectangle that changed."""

    PALETTE_SAMPLE = 4_000_000

    def __init__(self, count: int) -> None:
        self._count = max(1, count)  # frames to come: sets how finely each is sampled for the palette
        self._frames: list[bytes] = []
        self._samples: list[np.ndarray] = []
        self._shape: tuple[int, ...] = ()
        self._stride = 0

    def add(self, rgb: np.ndarray) -> None:
        if not self._stride:
            self._shape = rgb.shape
            self._stride = max(1, math.ceil(math.sqrt(self._count * rgb.shape[0] * rgb.shape[1] / self.PALETTE_SAMPLE)))
        self._frames.append(zlib.compress(np.ascontiguousarray(rgb).tobytes(), 1))
        self._samples.append(rgb[:: self._stride, :: self._stride].copy())

    def encode(self, durations_ms: list[int]) -> bytes:
        from PIL import Image

        sample = Image.fromarray(np.concatenate(self._samples, axis=0))
        palette = sample.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        frames = [Image.fromarray(np.frombuffer(zlib.decompress(data), dtype=np.uint8).reshape(self._shape))
                  .quantize(palette=palette, dither=Image.Dither.NONE) for data in self._frames]
        buffer = io.BytesIO()
        frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=durations_ms, loop=0,
                       disposal=1, optimize=True)
        return buffer.getvalue()


class Mp4Encoder:
    """H.264 frames muxed into an MP4 file as they come; the stream is flushed and closed on leaving."""

    def __init__(self, path: Path, width: int, height: int, fps: float) -> None:
        import av

        self.path = path
        self.size = (width + width % 2, height + height % 2)  # yuv420p halves both sides
        rate = Fraction(fps).limit_denominator(1000)
        self._ticks = rate.denominator  # per frame, in a time base of 1/rate.numerator seconds
        self._count = 0
        self.container = av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"})
        self.stream = self.container.add_stream("libx264", rate=rate, options=dict(X264_OPTIONS))
        self.stream.width, self.stream.height = self.size
        self.stream.pix_fmt = "yuv420p"
        context = self.stream.codec_context
        context.time_base = Fraction(1, rate.numerator)
        for name in ("color_primaries", "color_trc", "colorspace"):  # players then decode the colours as written
            with contextlib.suppress(AttributeError, ValueError, TypeError):
                setattr(context, name, BT709)
        with contextlib.suppress(AttributeError, ValueError, TypeError):
            context.color_range = 1  # limited (MPEG) range, what players expect of H.264

    def add(self, rgb: np.ndarray, times: int = 1) -> None:
        import av

        frame = av.VideoFrame.from_ndarray(padded(rgb, self.size[1], self.size[0]), format="rgb24")
        frame = frame.reformat(format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG")
        frame.time_base = self.stream.codec_context.time_base
        for _ in range(times):
            frame.pts = self._count * self._ticks
            self._count += 1
            for packet in self.stream.encode(frame):
                self.container.mux(packet)

    def __enter__(self) -> Mp4Encoder:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                for packet in self.stream.encode(None):  # the frames the encoder still holds
                    self.container.mux(packet)
        finally:
            if exc_type is None:
                self.container.close()
            else:
                with contextlib.suppress(Exception):
                    self.container.close()
