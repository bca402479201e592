"""The state machines of the plan (docs/ARCHITECTURE.md, "State machines"): for each
state field, its table as data and the one function that changes it. Services call
these; nothing else writes a state field."""
