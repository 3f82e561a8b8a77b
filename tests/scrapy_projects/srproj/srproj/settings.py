"""A scrapy-redis project's settings, as such projects write them. The tests copy the
project and change only the class paths to run it on redcrawl."""

import os

BOT_NAME = "srproj"
SPIDER_MODULES = ["srproj.spiders"]
NEWSPIDER_MODULE = "srproj.spiders"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 1  # one page at a time, so the fetch order shows the queue's order
DOWNLOAD_TIMEOUT = 5

# scrapy-redis
SCHEDULER = "scrapy_redis.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
SCHEDULER_PERSIST = True
SCHEDULER_QUEUE_CLASS = "scrapy_redis.queue.PriorityQueue"
REDIS_URL = os.environ["SRPROJ_REDIS_URL"]
REDIS_START_URLS_AS_SET = False
REDIS_START_URLS_KEY = "%(name)s:seeds"
MAX_IDLE_TIME_BEFORE_CLOSE = int(os.environ.get("SRPROJ_MAX_IDLE", "2"))

# test instrumentation (tests/scrapy_projects/rc_testkit.py, on PYTHONPATH)
EXTENSIONS = {"rc_testkit.Report": 500}
RC_TEST_OUT = os.environ.get("SRPROJ_REPORT")
