"""The front-end libraries the dashboard serves: installed from npm by `make ui-assets`
(package.json, package-lock.json) into node_modules, never fetched from a CDN, never
committed."""

from __future__ import annotations

from pathlib import Path

from service.settings import Settings

SOURCE_ROOT = Path(__file__).resolve().parents[2]
# What a page may ask for under /ui/vendor/, and where npm put it.
VENDOR_FILES = {
    "uPlot.iife.min.js": "uplot/dist/uPlot.iife.min.js",
    "uPlot.min.css": "uplot/dist/uPlot.min.css",
}
MISSING_HINT = (
    "The dashboard's front-end libraries are not installed: run `make ui-assets` "
    "(npm ci, from package-lock.json) in the source directory, or point "
    "DLAAS_UI_ASSETS_DIR at the node_modules directory that holds them."
)


def assets_dir(settings: Settings) -> Path:
    """DLAAS_UI_ASSETS_DIR, default the source's node_modules."""
    return settings.ui_assets_dir or SOURCE_ROOT / "node_modules"


def vendor_path(settings: Settings, name: str) -> Path | None:
    """The installed file behind /ui/vendor/<name>, or None if `name` is none of ours."""
    relative = VENDOR_FILES.get(name)
    return None if relative is None else assets_dir(settings) / relative


def missing(settings: Settings) -> list[str]:
    """The vendor files that are not installed."""
    return [
        name for name in VENDOR_FILES if not (assets_dir(settings) / VENDOR_FILES[name]).is_file()
    ]
