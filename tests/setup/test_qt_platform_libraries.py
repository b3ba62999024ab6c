"""bootstrap.py names the system libraries Qt's X11 plugin lacks, with the command that installs them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bootstrap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None
                                or shutil.which("cc") is None, reason="ldd and a C compiler on Linux")


def build_library_needing(tmp_path: Path, sonames: list[str]) -> Path:
    """A real shared library linked against libraries with these sonames, which are then deleted."""
    deps = tmp_path / "deps"
    deps.mkdir()
    flags = []
    for i, soname in enumerate(sonames):
        (deps / f"dep{i}.c").write_text(f"int dep{i}(void) {{ return {i}; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(deps / soname),
                        str(deps / f"dep{i}.c")], check=True)
        flags.append(f"-l:{soname}")
    calls = " + ".join(f"dep{i}()" for i in range(len(sonames)))
    decls = "".join(f"int dep{i}(void);\n" for i in range(len(sonames)))
    (tmp_path / "user.c").write_text(f"{decls}int user(void) {{ return {calls}; }}\n")
    user = tmp_path / "libuser.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(user), str(tmp_path / "user.c"),
                    f"-L{deps}", *flags], check=True)
    shutil.rmtree(deps)
    return user


def test_the_libraries_the_linker_cannot_find_are_named(tmp_path: Path) -> None:
    absent = ["libspecdeck-absent-a.so.1", "libspecdeck-absent-b.so.2"]
    user = build_library_needing(tmp_path, absent)
    assert bootstrap.missing_libraries([user]) == absent
    assert bootstrap.missing_libraries([Path(sys.executable).resolve()]) == []


def test_the_hint_gives_the_apt_and_dnf_commands() -> None:
    hint = bootstrap.qt_platform_hint(["libxcb-cursor.so.0", "libxcb-icccm.so.4"])
    assert "sudo apt-get install libxcb-cursor0 libxcb-icccm4." in hint
    assert "sudo dnf install xcb-util-cursor xcb-util-wm." in hint
    odd = bootstrap.qt_platform_hint(["libspecdeck-absent-a.so.1"])
    assert "apt-get" not in odd
    assert "provide libspecdeck-absent-a.so.1" in odd


@pytest.mark.process
def test_every_library_qt_s_x11_plugin_links_is_known() -> None:
    """What the venv's own Qt plugin and its library link from the system, each with its package."""
    binaries = bootstrap.qt_xcb_binaries()
    if not binaries:
        pytest.skip("PySide6's X11 plugin is not in this venv")
    out = "".join(subprocess.run(["ldd", str(b)], capture_output=True, text=True).stdout for b in binaries)
    linked = {line.split()[0] for line in out.splitlines() if "xcb" in line.split(" ")[0] and "=>" in line}
    linked = {name for name in linked if not name.startswith("libQt6")}
    assert linked
    assert linked - {"libxcb.so.1", "libxcb-render.so.0", "libxcb-shm.so.0", "libxcb-sync.so.1",
                     "libxcb-xfixes.so.0", "libxcb-glx.so.0", "libxcb-present.so.0", "libxcb-dri3.so.0"} \
        <= set(bootstrap.QT_XCB_PACKAGES)
