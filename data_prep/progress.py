"""Progress that reads well in a terminal and in a log file.

On a terminal, progress is a tqdm bar. Without one (a Slurm job, CI, ``make
reproduce-table > log 2>&1``) a bar would write a carriage-return frame at every refresh,
thousands of them per run, so the same figures (count, total, the caller's figures such as
loss and val, rate, elapsed) come as one plain line every ``every_s`` seconds instead: at
the first update, then at most once per interval, then once at the end.

``SCAPE_PROGRESS_EVERY_S`` sets that interval (default 30 s) for every stage at once.

Other libraries draw their own bars (lm-eval's "Tokenizing inputs" passes ``disable=``
explicitly, so tqdm's ``TQDM_DISABLE``, read once at import, cannot reach it);
``quiet_bars_without_terminal()``, called by the stage entry points, makes every tqdm bar
whose output is not a terminal a silent one.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from typing import Any, TextIO

__all__ = [
    "EVERY_S_ENV",
    "Progress",
    "is_terminal",
    "plain_interval_s",
    "quiet_bars_without_terminal",
]

EVERY_S_ENV = "SCAPE_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 30.0


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def plain_interval_s() -> float:
    """Seconds between plain progress lines: ``$SCAPE_PROGRESS_EVERY_S``, else 30."""
    raw = os.environ.get(EVERY_S_ENV)
    if raw is None or raw == "":
        return DEFAULT_EVERY_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(
            f"{EVERY_S_ENV}={raw!r} is not a number of seconds; set it to e.g. 30, or unset it"
        )
    return seconds


def _format_figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A bar on a terminal, a plain line every ``every_s`` seconds otherwise.

    ``update(n, **figures)`` advances by ``n``; ``advance_to(done, **figures)`` sets the
    position (for progress read back from a file). Figures are shown as ``name=value``
    (floats to 3 decimals); a figure passed as None is left out. ``enabled=False`` shows
    nothing. ``initial`` is where a resumed count starts (the rate counts from there);
    ``bar=False`` writes plain lines even to a terminal (a rank whose launcher draws the bar).
    Use as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        initial: int = 0,
        bar: bool = True,
    ) -> None:
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = plain_interval_s() if every_s is None else every_s
        self.done = initial
        self.figures: dict[str, Any] = {}
        self._start = time.monotonic()
        self._last_line: float | None = None
        self._printed_done = initial
        self._bar = None
        if enabled and bar and is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                file=self.stream,
                dynamic_ncols=True,
                initial=initial,
            )

    @property
    def plain(self) -> bool:
        """Whether progress goes out as plain lines (enabled, and no terminal)."""
        return self.enabled and self._bar is None

    def update(self, n: int = 1, **figures: Any) -> None:
        self.advance_to(self.done + n, **figures)

    def advance_to(self, done: int, **figures: Any) -> None:
        if not self.enabled:
            return
        self.figures.update({k: v for k, v in figures.items() if v is not None})
        if self._bar is not None:
            if figures:  # before update(), which draws them
                self._bar.set_postfix(
                    {k: _format_figure(v) for k, v in self.figures.items()}, refresh=False
                )
            if done != self.done:  # back too: a resumed run restarts at its checkpoint
                self._bar.update(done - self.done)
            self.done = done
            return
        self.done = done
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self.every_s:
            self._write_line(now)

    def line(self, now: float | None = None) -> str:
        """The plain progress line for the current position."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._start
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        parts = [f"{self.desc}: {count} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        parts += [f"{k}={_format_figure(v)}" for k, v in self.figures.items()]
        # the rate since the previous line: what a reader of a long log wants to know now
        since = self._start if self._last_line is None else self._last_line
        done_then = self._printed_done
        seconds = now - since
        # max: a resumed count may step back to its checkpoint
        rate = max(0, self.done - done_then) / seconds if seconds > 0 else 0.0
        parts.append(f"{rate:.2f} {self.unit}/s")
        parts.append(f"elapsed {_format_elapsed(elapsed)}")
        return ", ".join(parts)

    def _write_line(self, now: float) -> None:
        print(self.line(now), file=self.stream, flush=True)
        self._last_line, self._printed_done = now, self.done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self.enabled = False  # closed: later updates draw nothing
        elif self.plain:
            # the end, unless nothing happened or it was just printed
            if self._last_line is not None and self._printed_done != self.done:
                self._write_line(time.monotonic())
            self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_quieted = False


def quiet_bars_without_terminal() -> None:
    """Make every tqdm bar whose output is not a terminal a disabled one, from now on.

    Checked when each bar is made, against the stream it draws to (its ``file``, else
    stderr), so a bar on a terminal is untouched. Idempotent. Other libraries' bars (lm-eval,
    datasets, huggingface_hub) subclass ``tqdm.std.tqdm``, so this reaches them too.
    """
    global _quieted
    if _quieted:
        return
    import tqdm.std

    original = tqdm.std.tqdm.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        stream = bound.arguments.get("file") or sys.stderr
        if not is_terminal(stream):
            bound.arguments["disable"] = True
        original(*bound.args, **bound.kwargs)

    tqdm.std.tqdm.__init__ = __init__
    _quieted = True
