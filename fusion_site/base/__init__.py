"""The base floor (docs/ARCHITECTURE.md): running processes, redacting secrets and reading
git, with no knowledge of missions or validation. Both apps build on it."""
