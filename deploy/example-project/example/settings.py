"""Settings of the example project the worker image carries (replace it with yours).

`redcrawl crawl` adds redcrawl's scheduler and dupefilter itself; the Redis comes from
REDCRAWL_REDIS_URL in the environment."""

BOT_NAME = "example"
SPIDER_MODULES = ["example.spiders"]
ROBOTSTXT_OBEY = True
DOWNLOAD_DELAY = 0.5
CONCURRENT_REQUESTS_PER_DOMAIN = 2
LOG_LEVEL = "INFO"
