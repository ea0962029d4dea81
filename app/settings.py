"""All configuration, from the environment (prefix ``TOKENTRACE_``), in one object."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_database_url() -> str:
    data_dir = Path(platformdirs.user_data_dir("tokentrace"))
    return f"sqlite:///{data_dir / 'tokentrace.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENTRACE_", extra="ignore")

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL; default: a SQLite file in the user's data directory",
    )
    sql_echo: bool = False


def get_settings() -> Settings:
    return Settings()
