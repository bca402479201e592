"""Forges: a mission that follows a repository on GitHub, GitLab or Gitea (docs/FORGES.md).

Webhooks in (`/hooks/<provider>/<mission key>/`) complete tasks at the pushed heads;
commit statuses and one kept-up-to-date pull-request comment go out through a durable
outbox. This app is the top floor: it reads the plan (`missions`) and the verdicts
(`validation`), and neither of them imports it.
"""
