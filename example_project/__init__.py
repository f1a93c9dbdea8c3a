"""A small shop that uses every kind of dedup job; ``python manage.py demo`` shows them."""

from example_project.celery import app as celery_app

__all__ = ("celery_app",)
