"""The embedded database: Django's SQLite backend with writers queued in the process
(`fusion_site/sqlite/base.py`)."""
