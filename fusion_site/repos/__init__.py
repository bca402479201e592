"""Git at the edge: sources, mirrors, names to commits, snapshots (docs/REPOSITORIES.md)."""
