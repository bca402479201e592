"""The forges' services: what a run's start and end arm in the outbox (`arming`), what the
pull request's comment says (`comment`), and sending it (`delivery`)."""
