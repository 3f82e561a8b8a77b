"""Scrapy spiders and a scrapy-redis-style project that tests/test_scheduler.py and
tests/test_migration.py run in subprocesses, plus the harness that runs them."""
