"""A script call whose server still lacks the script after redis-py reloaded it
(redcrawl.scripts.Scripts.run). Seen in CI: a Scrapy worker on a Redis Cluster, just after
its master was killed and the replica promoted, stopped with "Redis refused disown: No
matching script": redis-py's retry had loaded the script by a topology that was already
out of date, on another server than the one the call reached. Here that is two real
servers: a client whose SCRIPT LOAD goes to one while its calls go to the other."""

from __future__ import annotations

from typing import Any

import redis

from redcrawl.redis_server import RedisServer
from redcrawl.scripts import BASE, Scripts


class LoadsElsewhere(redis.Redis):
    """Calls go to its own server; SCRIPT LOAD goes to ``elsewhere`` (as a cluster client
    with an out-of-date map loads a script on the old master and calls the new one)."""

    elsewhere: redis.Redis

    def script_load(self, script: Any) -> Any:
        return self.elsewhere.script_load(script)


def test_a_script_the_server_still_lacks_after_the_reload_runs_with_eval(
    redis7: RedisServer, redis62: RedisServer
) -> None:
    client = LoadsElsewhere.from_url(redis7.url)
    assert isinstance(client, LoadsElsewhere)
    client.elsewhere = redis.Redis.from_url(redis62.url)
    scripts = Scripts(client, {"base": [BASE]})
    sha = scripts["base"].sha
    client.script_flush()  # the server the calls reach lacks it, and keeps lacking it
    assert scripts.run("base", [], []) is None  # (base.lua only defines functions)
    assert client.script_exists(sha) == [True]  # kept there for the next EVALSHA
    assert scripts.run("base", [], []) is None
