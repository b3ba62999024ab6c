"""The window follows the system's light or dark colour scheme (Qt's style hints), and changes with it.

Where the system is dark and the style's palette is not (Qt's older Windows styles, a desktop whose platform
theme gives no dark palette), the window takes Fusion with a dark palette; it gives that palette back when the
system turns light. Widgets that paint with palette colours of their own redo them on ``PaletteChange``."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

_DARK = {
    QPalette.ColorRole.Window: (45, 45, 48),
    QPalette.ColorRole.WindowText: (222, 222, 222),
    QPalette.ColorRole.Base: (28, 28, 30),
    QPalette.ColorRole.AlternateBase: (45, 45, 48),
    QPalette.ColorRole.ToolTipBase: (45, 45, 48),
    QPalette.ColorRole.ToolTipText: (222, 222, 222),
    QPalette.ColorRole.PlaceholderText: (150, 150, 150),
    QPalette.ColorRole.Text: (222, 222, 222),
    QPalette.ColorRole.Button: (55, 55, 58),
    QPalette.ColorRole.ButtonText: (222, 222, 222),
    QPalette.ColorRole.BrightText: (255, 90, 90),
    QPalette.ColorRole.Link: (100, 170, 255),
    QPalette.ColorRole.LinkVisited: (170, 140, 255),
    QPalette.ColorRole.Highlight: (42, 130, 218),
    QPalette.ColorRole.HighlightedText: (255, 255, 255),
    QPalette.ColorRole.Light: (75, 75, 78),
    QPalette.ColorRole.Midlight: (62, 62, 65),
    QPalette.ColorRole.Mid: (40, 40, 42),
    QPalette.ColorRole.Dark: (25, 25, 26),
    QPalette.ColorRole.Shadow: (10, 10, 10),
}
_DISABLED = (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText)


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, rgb in _DARK.items():
        palette.setColor(role, QColor(*rgb))
    for role in _DISABLED:
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(128, 128, 128))
    return palette


class ColourSchemeFollower(QObject):
    """Keeps the application's palette in step with the system's colour scheme."""

    def __init__(self, app: QApplication) -> None:
        super().__init__(app)
        self.setObjectName("colour_scheme_follower")
        self._app = app
        self.own_palette = False  # the dark palette is this object's, so a light scheme takes it back
        hints = app.styleHints()
        hints.colorSchemeChanged.connect(self.apply)
        self.apply(hints.colorScheme())

    @Slot(Qt.ColorScheme)
    def apply(self, scheme: Qt.ColorScheme) -> None:
        app = self._app
        if scheme == Qt.ColorScheme.Dark and not is_dark(app.palette()):
            fusion = QStyleFactory.create("Fusion")
            if fusion is not None:
                app.setStyle(fusion)
            app.setPalette(dark_palette())
            self.own_palette = True
        elif scheme != Qt.ColorScheme.Dark and self.own_palette:
            app.setPalette(app.style().standardPalette())
            self.own_palette = False


def follow_colour_scheme(app: QApplication) -> ColourSchemeFollower:
    """The application's one follower (made on first use)."""
    found = app.findChild(ColourSchemeFollower, "colour_scheme_follower")
    return found if isinstance(found, ColourSchemeFollower) else ColourSchemeFollower(app)
