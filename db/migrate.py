"""Alembic, driven from code: `laneway db upgrade` and the tests use these."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from core.config.settings import Settings, get_settings

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(settings: Settings | None = None, url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url or (settings or get_settings()).database_url)
    return cfg


def upgrade(
    settings: Settings | None = None, url: str | None = None, revision: str = "head"
) -> None:
    command.upgrade(alembic_config(settings, url), revision)
