"""The engine: the decisions of dedup_jobs, free of any task framework (SPEC K5).

It imports neither Celery nor ``django.tasks`` (import-linter holds that, see pyproject.toml):
the Celery job classes (``dedup_jobs/jobs/``) are a front-end that builds a
:class:`~dedup_jobs.engine.message.Message` once per delivery, asks the engine and acts on its
answer (raise ``Ignore``, publish again, mark a result). Where each decision lives:

- ``message.py``: one message at the worker, as the decisions see it (owner, header, observe
  mode, redelivery mark), computed once by the front-end;
- ``dispatch.py``: a dispatch's lock call (U1/R1/S7) and whether it publishes;
- ``start.py``: the worker's lock check (W1/W3/W5/R2) as one store call and its answer as one
  value (:class:`~dedup_jobs.stores.answers.StartAnswer`), and how long a message waits;
- ``debounce.py``: a burst taken out of the store by its message id, and the undo of a
  debounce dispatch that failed (D9, S7);
- ``takeover.py``: a queued message whose lock another dispatch took over (R1/S7);
- ``store_errors.py``: what a decision does when its store call cannot reach the store
  (W4/W7);
- ``throttle_admission.py``: a message admitted under its throttle key, or deferred (T2/T3);
- ``throttle.py``: throttle options, rates and the holding of a concurrency slot (T1-T3);
- ``lease.py``: the leases of running jobs (W6), and the re-send of a lost check (W4);
- ``rollback.py``: undos and releases re-sent until the store answers (S7);
- ``native.py``: a real OS thread and lock under gevent/eventlet.
"""
