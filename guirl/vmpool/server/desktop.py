"""What the server does on the desktop itself: screenshots (mss + PNG) and typed actions, in-process.

pyautogui is imported once, when the first action runs (it needs the display), so an action costs a
function call, not a Python start-up as OSWorld's `/execute` of `python -c "import pyautogui; ..."` does.
"""

from __future__ import annotations

import os
import time
from typing import Any

from guirl.agent.actions import (
    AnyAction,
    Click,
    Done,
    Drag,
    DragTo,
    Fail,
    Hotkey,
    MoveTo,
    Scroll,
    TypeText,
    Wait,
)


class Desktop:
    """The X display this server runs on."""

    def __init__(self, display: str, *, png_level: int = 1, cursor: bool = True) -> None:
        self.display = display
        self.png_level = png_level
        # the pointer drawn in (XFixes' cursor image at its hotspot), as OSWorld's server draws it
        self.cursor = cursor
        self._mss: Any = None
        self._pyautogui: Any = None

    # -- screen --------------------------------------------------------------------------------------

    def _grabber(self) -> Any:
        if self._mss is None:
            import mss

            self._mss = mss.MSS(display=self.display, with_cursor=self.cursor)
        return self._mss

    def screen_size(self) -> tuple[int, int]:
        mon = self._grabber().monitors[1]
        return mon["width"], mon["height"]

    def screenshot(self, level: int | None = None) -> bytes:
        """The whole screen as PNG (zlib level `level`, default the server's). mss's encoder (one join, one
        zlib call on this thread) measured faster here than splitting the deflate across threads."""
        import mss.tools

        shot = self._grabber().grab(self._grabber().monitors[1])
        return mss.tools.to_png(shot.rgb, shot.size, level=self.png_level if level is None else level)

    # -- input ---------------------------------------------------------------------------------------

    def gui(self) -> Any:
        """pyautogui, configured for an agent: no failsafe corner, no pause after every call."""
        if self._pyautogui is None:
            os.environ["DISPLAY"] = self.display
            import pyautogui

            pyautogui.FAILSAFE = False
            pyautogui.PAUSE = 0.0
            self._pyautogui = pyautogui
        return self._pyautogui

    def cursor_position(self) -> tuple[int, int]:
        x, y = self.gui().position()
        return int(x), int(y)

    def perform_and_capture(self, action: AnyAction, screenshot: bool = True) -> bytes | None:
        """Execute `action`, then (if asked) take the next screenshot."""
        self.perform(action)
        return self.screenshot() if screenshot else None

    def perform(self, action: AnyAction) -> None:
        """Execute one typed action (raises ValueError for one that cannot be done here)."""
        g = self.gui()
        w, h = self.screen_size()
        for name in ("x", "y", "to_x", "to_y"):
            v = getattr(action, name, None)
            if v is not None and v >= (w if name.endswith("x") else h):
                raise ValueError(f"{name}={v} is off the {w}x{h} screen")
        match action:
            case Click(x=x, y=y, button=b, clicks=n):
                g.click(x, y, clicks=n, interval=0.05 if n > 1 else 0.0, button=b)  # it sleeps after each
            case MoveTo(x=x, y=y):
                g.moveTo(x, y)
            case Drag(x=x, y=y, to_x=tx, to_y=ty, button=b):
                g.moveTo(x, y)
                g.dragTo(tx, ty, duration=0.2, button=b)
            case DragTo(to_x=tx, to_y=ty, button=b):
                g.dragTo(tx, ty, duration=0.2, button=b)
            case Scroll(amount=a, horizontal=hor, x=x, y=y):
                at = {"x": x, "y": y} if x is not None and y is not None else {}
                (g.hscroll if hor else g.scroll)(a, **at)
            case TypeText(text=text):
                # pyautogui types "<" as ">" on X (a keysym mapping bug OSWorld also works around)
                pieces = text.split("<")
                for i, piece in enumerate(pieces):
                    if piece:
                        g.write(piece, interval=0.0)
                    if i < len(pieces) - 1:
                        g.hotkey("shift", ",")
            case Hotkey(keys=keys):
                unknown = [k for k in keys if not g.isValidKey(k.lower())]
                if unknown:
                    raise ValueError(f"unknown key name(s) {unknown}")
                g.hotkey(*[k.lower() for k in keys])
            case Wait(seconds=s):
                time.sleep(s)
            case Done() | Fail():
                pass
