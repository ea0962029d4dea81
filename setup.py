"""Build hook only (all metadata is in pyproject.toml).

Ships the top-level ``migrations/`` folder (Alembic env.py, script template, versions)
inside the wheel as ``app/storage/_migrations`` so that ``app.storage.db.upgrade_database``
finds it in a non-editable install. In a source checkout or an editable install it uses
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
        src = ROOT / "migrations"
        dst = Path(self.build_lib) / "app" / "storage" / "_migrations"
        for f in sorted(src.rglob("*")):
            if f.is_file() and f.suffix in {".py", ".mako"} and "__pycache__" not in f.parts:
                target = dst / f.relative_to(src)
                self.mkpath(str(target.parent))
                self.copy_file(str(f), str(target))


setup(cmdclass={"build_py": BuildPyWithMigrations})
