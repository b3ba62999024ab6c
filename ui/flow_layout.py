"""A layout that places widgets in a row and wraps them onto further rows when the width runs out.

Used where a row of labels or buttons must fit a narrow window (the dashboard's numbers strip, the
chat's buttons): a plain QHBoxLayout's minimum width is the sum of its widgets and pushes the window wider.
"""

from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QSizePolicy, QWidget


class FlowLayout(QLayout):
    def __init__(self, parent: QWidget | None = None, h_spacing: int = 8, v_spacing: int = 4) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._h = h_spacing
        self._v = v_spacing
        self._heights: dict[int, int] = {}  # heightForWidth, until the next invalidate
        self.arrangements = 0  # times the items were placed (a relayout), for tests
        self.setContentsMargins(QMargins(0, 0, 0, 0))

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        # Qt asks this several times per relayout, for the same width.
        if width not in self._heights:
            self._heights[width] = self._arrange(QRect(0, 0, width, 0), apply=False)
        return self._heights[width]

    def invalidate(self) -> None:
        self._heights.clear()
        super().invalidate()

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self.arrangements += 1
        self._arrange(rect, apply=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        """The widest single item: anything wider wraps."""
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _arrange(self, rect: QRect, apply: bool) -> int:
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        x, y, line_height = area.x(), area.y(), 0
        for item in self._items:
            widget = item.widget()
            if widget is not None and widget.isHidden():
                continue
            hint = item.sizeHint()
            if widget is not None and widget.sizePolicy().horizontalPolicy() == QSizePolicy.Policy.Ignored:
                hint = item.minimumSize()
            width = min(hint.width(), area.width())
            if x > area.x() and x + width > area.right() + 1:
                x = area.x()
                y += line_height + self._v
                line_height = 0
            if apply:
                item.setGeometry(QRect(QPoint(x, y), QSize(width, hint.height())))
            x += width + self._h
            line_height = max(line_height, hint.height())
        return y + line_height - rect.y() + m.bottom()
