"""Webhooks in (docs/FORGES.md): a forge's request verified and recorded (`receive`),
answered at once, and processed by a worker (`process_delivery`): its event read
(`parsing`) and matched to the mission's tasks (`matching`).

- `signatures`: each provider's signature, delivery id and event name, read from the
  request's headers (and the generic form's body);
- `receive`: the request's steps, in order: the forge, the size, the signature, the
  replay, the record;
- `views`: the HTTP answer of each step;
- `parsing`: the event as one shape for every provider (a push, a pull request, or
  something to ignore with a reason);
- `matching` and `process`: the worker's side.
"""
