"""Build hook only (all metadata is in pyproject.toml).

Ships the top-level ``migrations/`` folder (Alembic env.py, script template, versions)
inside the wheel as ``app/storage/_migrations`` so that ``app.storage.db.upgrade_database``
finds it in a non-editable install, and ``templates/`` and ``static/`` as
``app/web/_assets`` for the dashboard. In a source checkout or an editable install it uses
``<repo>/migrations`` directly.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithMigrations(build_py):
    def run(self) -> None:
        super().run()
        lib = Path(self.build_lib) / "app"
        self._copy(ROOT / "migrations", lib / "storage" / "_migrations", {".py", ".mako"})
        self._copy(ROOT / "templates", lib / "web" / "_assets" / "templates", None)
        self._copy(ROOT / "static", lib / "web" / "_assets" / "static", None)

    def _copy(self, src: Path, dst: Path, suffixes: set[str] | None) -> None:
        for f in sorted(src.rglob("*")):
            if not f.is_file() or "__pycache__" in f.parts:
                continue
            if suffixes is not None and f.suffix not in suffixes:
                continue
            target = dst / f.relative_to(src)
            self.mkpath(str(target.parent))
            self.copy_file(str(f), str(target))


setup(cmdclass={"build_py": BuildPyWithMigrations})
