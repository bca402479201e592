"""What the service runs on: processes and their sandbox, secrets redacted, the broker and its queue, caches, and the loop's prepared statements."""
