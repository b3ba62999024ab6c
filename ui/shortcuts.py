"""The window's keyboard shortcuts: the same text sets each action's key and fills the Keyboard shortcuts
table (Help → Keyboard shortcuts)."""

from __future__ import annotations

import html

KEY_REGENERATE, KEY_CONTINUE, KEY_EDIT_LAST = "Ctrl+R", "Ctrl+Shift+Return", "Ctrl+E"
KEY_COPY_ANSWER, KEY_MESSAGE_BOX, KEY_RENAME = "Ctrl+Shift+C", "Ctrl+L", "F2"
SHORTCUTS = (
    ("Ctrl+Enter", "send the message (anywhere in the window)"),
    ("Esc", "stop the answer (while one is being written)"),
    (KEY_REGENERATE, "regenerate the last answer"),
    ("Ctrl+Shift+Enter", "continue an answer cut at Max tokens"),
    (KEY_EDIT_LAST, "edit the last message"),
    (KEY_COPY_ANSWER, "copy the last answer"),
    (KEY_MESSAGE_BOX, "go to the message box"),
    ("Tab", "leave the message box (to Send)"),
    ("Ctrl+N", "new chat"),
    (KEY_RENAME, "rename the open chat"),
    ("Del", "delete the chat selected in the list (Undo delete brings it back)"),
    ("Ctrl+Z", "undo the last deletion of a chat or a message, or an edit not yet sent (outside a text box)"),
    ("Right-click a message", "copy, edit, regenerate or delete that message"),
    ("Ctrl+Q", "quit"),
)
SHORTCUTS_HTML = "<table cellspacing='0' cellpadding='3'>" + "".join(
    f"<tr><td><b>{html.escape(keys)}</b></td><td>{html.escape(what)}</td></tr>" for keys, what in SHORTCUTS
) + "</table>"
